"""Flow control counts each outstanding sample once (`flow.outstanding_samples`, `TaskDispenser.leased_samples`)."""
from __future__ import annotations

import pytest

from sao.transport import flow
from sao.transport.dispenser import TaskDispenser
from sao.transport.group_buffer import GroupBuffer
from sao.transport.leases import DispenserConfig
from sao.transport.trajectory import ReasonCode, Trajectory, TrajectoryError


def _traj(lease, index, version=0):
  return Trajectory(task_id=lease.task_id, token_ids=[1], action_mask=[True], rollout_logprobs=[-0.1], reward=0.0,
                    policy_version=version, sample_index=index, lease_id=lease.lease_id)


def _submit(dispenser, buffer, lease, index, version=0, current=0, max_staleness=4):
  traj = _traj(lease, index, version)
  held = flow.admit(dispenser, buffer, traj, "w", current, max_staleness)
  flow.accept(dispenser, buffer, held, traj)


def _allowance(dispenser, buffer, max_outstanding, requested=100):
  outstanding = flow.outstanding_samples(dispenser, buffer)
  return outstanding, flow.lease_allowance(requested, max_outstanding, outstanding, dispenser.config.group_size)


def test_a_partly_accepted_group_counts_once():
  """G = 8, max_outstanding 24: two leased groups are 16 samples. Once group A's first sample is in, A's buffer
  reservation (8) stands for all of A, and its lease's 7 running samples are not counted again: still 16
  outstanding, room for one more group. (Counting live leases × G on top of the occupancy made it 8 + 2 × 8 = 24:
  no room, and a fleet of half-filled groups ran below its budget.)"""
  dispenser = TaskDispenser([{"id": str(i)} for i in range(8)], DispenserConfig(mode="group", group_size=8))
  buffer = GroupBuffer(64)
  a, b = dispenser.lease("w", 2)
  assert _allowance(dispenser, buffer, 24) == (16, 1)
  _submit(dispenser, buffer, a, 0)
  assert dispenser.leased_samples() == 15 and dispenser.leased_samples(excluding=[a.group_id]) == 8
  assert _allowance(dispenser, buffer, 24) == (16, 1)
  for index in range(1, 8):
    _submit(dispenser, buffer, a, index)
  assert dispenser.leased_samples(excluding=[b.group_id]) == 0  # A's lease is done; A is ready in the buffer
  assert _allowance(dispenser, buffer, 24) == (16, 1)
  assert len(buffer.take(8)) == 8  # the learner takes A: only B is out
  assert _allowance(dispenser, buffer, 24) == (8, 2)


def test_a_re_leased_sample_counts_as_one():
  """A stale-rejected sample is re-leased alone: its lease holds one sample, not G."""
  dispenser = TaskDispenser([{"id": str(i)} for i in range(8)], DispenserConfig(mode="group", group_size=4))
  buffer = GroupBuffer(64)
  (a,) = dispenser.lease("w", 1)
  with pytest.raises(TrajectoryError) as e:
    flow.admit(dispenser, buffer, _traj(a, 0, version=0), "w", current_version=5, max_staleness=2)
  assert e.value.reason_code == ReasonCode.STALE_POLICY
  (again,) = dispenser.lease("w", 1)
  assert again.sample_indices == (0,)
  assert dispenser.leased_samples() == 4  # 3 left in the first lease + 1 in the re-lease
  assert _allowance(dispenser, buffer, 8) == (4, 1)


def test_sao_counts_leases_and_buffered_samples():
  dispenser = TaskDispenser([{"id": str(i)} for i in range(8)], DispenserConfig())
  buffer = GroupBuffer(16)
  leases = dispenser.lease("w", 3)
  _submit(dispenser, buffer, leases[0], 0)
  assert _allowance(dispenser, buffer, 4) == (3, 1)  # 2 leased + 1 buffered
  assert flow.lease_allowance(5, 0, 99, 1) == 5  # no cap


def test_the_leased_count_follows_every_lease_change():
  """`leased_samples` is kept as leases change; it must equal the live leases' pending samples after leasing,
  accepting, rejecting as stale, expiry and re-leasing, restoring a logged sample, and a checkpoint round trip."""
  now = [0.0]
  config = DispenserConfig(mode="group", group_size=3, lease_ttl_s=10.0)
  dispenser = TaskDispenser([{"id": str(i)} for i in range(20)], config, clock=lambda: now[0])
  buffer = GroupBuffer(64)
  issued = []

  def check():
    live = [dispenser.lease_info(l.lease_id) for l in issued]
    assert dispenser.leased_samples() == sum(len(l.pending) for l in live if l is not None)

  issued += dispenser.lease("w", 3)
  check()
  _submit(dispenser, buffer, issued[0], 0)
  _submit(dispenser, buffer, issued[0], 1)
  check()
  with pytest.raises(TrajectoryError):
    flow.admit(dispenser, buffer, _traj(issued[1], 2, version=0), "w", current_version=9, max_staleness=2)
  check()
  now[0] = 11.0  # every lease lapses; their missing samples are re-leased
  issued += dispenser.lease("w", 2)
  check()
  assert dispenser.num_leased == 2
  logged = _traj(issued[-1], issued[-1].sample_indices[0])
  logged.group_id = issued[-1].group_id
  assert dispenser.restore_sample(logged) is not None
  check()
  restored = TaskDispenser([{"id": str(i)} for i in range(20)], config, clock=lambda: now[0])
  restored.load_state_dict(dispenser.state_dict())
  assert restored.leased_samples() == dispenser.leased_samples()
  for lease in issued:
    for index in sorted(lease.pending):
      if dispenser.lease_info(lease.lease_id) is not None:
        _submit(dispenser, buffer, lease, index)
  check()
  assert dispenser.leased_samples() == 0
