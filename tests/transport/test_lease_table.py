"""`sao.transport.lease_table.LeaseTable`: live leases and their pending-sample counts (the dispenser's lease
bookkeeping), checked against the count recomputed from the live leases after every change."""
import pytest

from sao.transport.lease_table import LeaseTable
from sao.transport.leases import Lease, Work


def _lease(lease_id: str, group_id: str, samples: tuple[int, ...], expires_at: float = 10.0) -> Lease:
  work = Work(0, False, group_id, samples)
  return Lease(lease_id=lease_id, worker_id="w", task_id="t", task_json="{}", group_id=group_id,
               sample_indices=samples, is_validation=False, temperature=1.0, env_name="", eval_version=-1,
               expires_at=expires_at, work=work, pending=set(samples))


def _recounted(table: LeaseTable, excluding=()) -> int:
  return sum(len(lease.pending) for lease in table if lease.group_id not in excluding)


def test_counts_follow_add_settle_expire_and_restore():
  table = LeaseTable()
  a, b, c = _lease("a", "g1", (0, 1, 2), expires_at=5.0), _lease("b", "g2", (0,)), _lease("c", "g1", (3,))
  for lease in (a, b, c):
    table.add(lease)
  assert len(table) == 3 and table.leased_samples() == _recounted(table) == 5
  assert table.leased_samples(excluding=["g1"]) == _recounted(table, ["g1"]) == 1

  table.settle(a, 1)
  table.settle(a, 1)  # not pending any more: no-op
  assert a.pending == {0, 2} and table.leased_samples() == _recounted(table) == 4
  table.settle(b, 0)  # its last sample: the lease ends
  assert table.get("b") is None and len(table) == 2 and table.leased_samples(excluding=["g2"]) == 3

  a.submitting.add(0)  # a submission in flight holds the lease past its expiry
  assert table.pop_expired(now=6.0) == [] and table.get("a") is a
  a.submitting.clear()
  assert table.pop_expired(now=6.0) == [a] and table.get("a") is None
  assert table.leased_samples() == _recounted(table) == 1
  table.settle(a, 0)  # an expired lease only loses the index; the live counts do not move
  assert a.pending == {2} and table.leased_samples() == 1

  table.set_pending(c, ())  # restored with its sample already accepted
  assert table.leased_samples() == _recounted(table) == 0 and table.leased_samples(excluding=["g1"]) == 0


def test_refuses_a_duplicate_id_and_a_lease_it_does_not_hold():
  table = LeaseTable()
  table.add(_lease("a", "g", (0,)))
  with pytest.raises(ValueError, match="'a': a live lease already has this id"):
    table.add(_lease("a", "g", (1,)))
  with pytest.raises(ValueError, match="'z' is not live"):
    table.set_pending(_lease("z", "g", (0,)), (0,))
