"""The dispenser's checkpoint format (`sao.transport.dispenser_state`): records round-trip, and a state from another
format or another dispenser is refused with the key that differs."""
import json

import pytest

from sao.transport import dispenser_state
from sao.transport.dispenser import DispenserConfig, TaskDispenser
from sao.transport.task_catalog import encode_tasks, epoch_order

TASKS = [{"id": f"t{i}"} for i in range(6)]


def test_records_round_trip_through_json():
  d = TaskDispenser(TASKS, DispenserConfig(mode="group", group_size=2, seed=3))
  (lease,) = d.lease("w", 1)
  record = json.loads(json.dumps(dispenser_state.lease_record(lease, now=lease.expires_at - 5.0)))
  assert record["ttl_left_s"] == 5.0 and record["pending"] == [0, 1]
  assert dispenser_state.work_from_record(record["work"]) == lease.work
  (saved,) = json.loads(json.dumps(d.state_dict()))["leases"]
  assert {k: v for k, v in saved.items() if k != "ttl_left_s"} == {k: v for k, v in record.items()
                                                                   if k != "ttl_left_s"}
  assert 0 < saved["ttl_left_s"] <= d.config.lease_ttl_s


def test_a_state_of_another_format_or_dispenser_is_refused():
  state = TaskDispenser(TASKS, DispenserConfig(seed=1)).state_dict()
  with pytest.raises(ValueError, match="dispenser state format 2, expected 1"):
    TaskDispenser(TASKS, DispenserConfig(seed=1)).load_state_dict({**state, "format": 2})
  with pytest.raises(ValueError, match="num_tasks=6 does not match this dispenser's 5"):
    TaskDispenser(TASKS[:5], DispenserConfig(seed=1)).load_state_dict(state)


def test_catalog_encodes_ids_and_orders_epochs_by_seed():
  assert encode_tasks([{"id": 3, "b": 1, "a": 2}], "id", "tasks") == [("3", '{"a": 2, "b": 1, "id": 3}')]
  assert sorted(epoch_order(0, 1, 10)) == list(range(10))
  assert list(epoch_order(0, 1, 10)) == list(epoch_order(0, 1, 10)) != list(epoch_order(0, 2, 10))
