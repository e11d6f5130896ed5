"""The trainer-side service's flow control and admission steps, as plain functions of the dispenser and the buffer.

`sao.transport.server.TrajectoryServer` runs them under its locks, between gRPC decoding and the durable log; the
fleet simulator (`sao.simulation`) runs the same functions under a simulated clock. Nothing here locks, sleeps or
touches a socket or a file: the caller owns the synchronisation.

  outstanding_samples  the samples out with the workers or held for the learner, each counted once.
  lease_allowance  how many tasks a LeaseTasks call may get under `max_outstanding` (`outstanding_samples`).
  admit            a submitted sample's lease is live (held against expiry), its version is fresh enough
                   (`policy_version >= current - max_staleness`, else STALE_POLICY, and the sample is re-leased at
                   once) and the buffer has room for its unit (else BACKPRESSURE).
  accept           the durable record is stored: the dispenser completes the sample and the buffer takes it.
  is_fresh         the trainer's own test at the step that takes a trajectory (learner version − policy version
                   <= max_staleness): what the buffer held may have aged past the bound since admission.
"""
from __future__ import annotations

import contextlib
from typing import ContextManager

from sao.transport.dispenser import TaskDispenser
from sao.transport.group_buffer import GroupBuffer
from sao.transport.leases import Lease
from sao.transport.trajectory import ReasonCode, Trajectory, TrajectoryError


def outstanding_samples(dispenser: TaskDispenser, buffer: GroupBuffer) -> int:
  """Samples leased or buffered, each counted once: the buffer's occupancy (ready units, plus the G reserved slots of
  every open group, which stand for that group's samples still running as well as the ones already in) plus the
  samples the dispenser's live leases hold for groups with no reservation yet (`TaskDispenser.leased_samples`). A
  group whose first samples are in is counted once, by its reservation; counting its lease too would let a pipeline
  of half-filled groups run ever further below `max_outstanding`. The caller holds the buffer's lock."""
  return buffer.occupancy + dispenser.leased_samples(excluding=buffer.open)


def lease_allowance(requested: int, max_outstanding: int, outstanding: int, group_size: int) -> int:
  """Tasks (G samples each) a lease call may get: `requested`, capped so the `outstanding` samples
  (`outstanding_samples`) stay <= `max_outstanding` (0 = no cap). Rollouts may run at most this far ahead of the
  learner, so trajectories are not generated only to go stale in a queue. <= 0 means none (the server answers with
  a backpressure retry hint)."""
  if not max_outstanding:
    return requested
  return min(requested, (max_outstanding - outstanding) // group_size)


def staleness(current_version: int, policy_version: int) -> int:
  """Versions a trajectory lags behind `current_version` (the trainer's count: learner version − policy version)."""
  return current_version - policy_version


def is_fresh(current_version: int, policy_version: int, max_staleness: int) -> bool:
  """Whether a trajectory sampled by `policy_version` may still be trained on at `current_version`."""
  return staleness(current_version, policy_version) <= max_staleness


def admit(dispenser: TaskDispenser, buffer: GroupBuffer, traj: Trajectory, worker_id: str | None,
          current_version: int, max_staleness: int,
          buffer_lock: ContextManager | None = None) -> Lease:
  """Holds `traj`'s lease (`TaskDispenser.begin_submission`), checks staleness and reserves buffer room for its unit;
  returns the lease. Raises `TrajectoryError` (UNKNOWN_LEASE, WRONG_WORKER, INVALID_FIELD from the dispenser;
  STALE_POLICY; BACKPRESSURE), releasing the hold. The caller `accept`s or `dispenser.abort_submission`s after.

  `buffer_lock` guards the reservation (the server's condition variable); None when the caller needs none.
  """
  lease = dispenser.begin_submission(traj, worker_id)
  try:
    if not traj.group_id:
      traj.group_id = lease.group_id  # workers may leave it to the lease; the stored record carries it
    if lease.is_validation:
      return lease
    oldest = current_version - max_staleness
    if not is_fresh(current_version, traj.policy_version, max_staleness):
      dispenser.reject_submission(lease, traj)  # final: the sample is re-leased now, not at lease expiry
      raise TrajectoryError("policy_version", ReasonCode.STALE_POLICY,
                            f"version {traj.policy_version} older than {oldest} (current {current_version}, "
                            f"max_staleness {max_staleness})")
    with buffer_lock or contextlib.nullcontext():
      if not buffer.reserve(traj.group_id, dispenser.group_size_of(traj.group_id)):
        raise TrajectoryError("trajectories", ReasonCode.BACKPRESSURE,
                              f"buffer full ({buffer.occupancy}/{buffer.capacity}); retry later")
  except BaseException:
    dispenser.abort_submission(lease, traj)  # a no-op for a rejected sample (no longer in the lease)
    raise
  return lease


def accept(dispenser: TaskDispenser, buffer: GroupBuffer, lease: Lease, traj: Trajectory) -> bool:
  """Ends an `admit`ted submission whose record is durable: the dispenser accepts the sample; a training sample joins
  its reserved group in the buffer, which moves to the ready queue once all its samples are in. Returns True for a
  training sample, False for a validation one (the dispenser's eval collector has it)."""
  complete = dispenser.complete(lease, traj)
  if lease.is_validation:
    return False
  buffer.add(traj)
  if complete:
    buffer.close(traj.group_id)
  return True
