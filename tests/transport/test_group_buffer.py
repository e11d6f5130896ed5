"""The group buffer alone: reservations bound occupancy, whole groups come out in sample order."""
import pytest

from sao.transport.group_buffer import GroupBuffer
from sao.transport.trajectory import Trajectory


def _traj(group_id: str, index: int) -> Trajectory:
  return Trajectory(task_id="t", sample_index=index, group_id=group_id, policy_version=0, token_ids=[1, 2],
                    action_mask=[0, 1], rollout_logprobs=[0.0, -0.5], reward=1.0, lease_id=group_id)


def test_reservations_bound_occupancy_and_groups_come_out_whole():
  buf = GroupBuffer(capacity=4)
  assert buf.reserve("g0", 2) and buf.reserve("g1", 2)
  assert not buf.reserve("g2", 1)  # 2 + 2 reserved: full although nothing is held yet
  assert (buf.occupancy, buf.held) == (4, 0)
  buf.add(_traj("g0", 1))
  buf.add(_traj("g0", 0))
  assert buf.take(2) is None  # g0 not closed yet
  buf.close("g0")
  out = buf.take(2)
  assert [(t.group_id, t.sample_index) for t in out] == [("g0", 0), ("g0", 1)]
  assert buf.occupancy == 2 and buf.reserve("g2", 2)


def test_release_if_empty_frees_only_an_unused_reservation():
  buf = GroupBuffer(capacity=2)
  buf.reserve("g0", 1)
  buf.reserve("g1", 1)
  buf.add(_traj("g1", 0))
  buf.release_if_empty("g0")
  buf.release_if_empty("g1")
  assert list(buf.open) == ["g1"] and buf.occupancy == 1
  assert buf.reserve("g2", 5, force=True) and buf.occupancy == 6  # restore may exceed the capacity
  with pytest.raises(ValueError, match="capacity"):
    GroupBuffer(0)
