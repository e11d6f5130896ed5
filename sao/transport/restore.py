"""Restart: rebuild the server's buffer and idempotency keys from the durable trajectory log.

Every logged key is remembered (a re-send of it stays a DUPLICATE); logged records the learner never consumed nor
quarantined are checked against the trainer's content limits (a record it cannot take, e.g. logged by an older
version of the trainer, is returned for quarantine instead: never buffered, never re-read), then buffered again,
as whole units: a complete group (or SAO sample) goes to the ready queue; a partial group goes back
to the dispenser (`TaskDispenser.restore_sample`) and waits, reserved, for its missing samples, unless the
dispenser does not know the group (its checkpoint predates the lease): then the partial group is dropped and its
task is leased afresh. Restored trajectories are buffered even beyond the buffer's capacity (warned): losing
acknowledged work would be worse.
"""
from __future__ import annotations

import dataclasses
import logging
import os

from sao.transport import log as log_lib
from sao.transport.admission import ContentLimits
from sao.transport.dispenser import TaskDispenser
from sao.transport.group_buffer import GroupBuffer
from sao.transport.trajectory import Trajectory, TrajectoryError

# Restored records may carry versions newer than the restored trainer (accepted after its last checkpoint): only
# the batch's int32 field bounds them.
_MAX_RESTORED_VERSION = 2**31 - 1

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class RestoreResult:
  """What a restore found: every logged key, how many of them were consumed (quarantined ones included), how many
  partial-group samples were dropped, the unconsumed records that fail the content limits (to quarantine), and
  what reading the log lost."""
  accepted_keys: set[log_lib.SampleKey]
  num_consumed: int
  num_dropped: int
  to_quarantine: list[tuple[Trajectory, TrajectoryError]]
  log_report: log_lib.LogReadReport


def restore_buffer(log_dir: str | os.PathLike, dispenser: TaskDispenser, buffer: GroupBuffer,
                   limits: ContentLimits | None = None) -> RestoreResult:
  """Buffers the accepted-but-unconsumed records of the log in `log_dir` (see the module docstring)."""
  consumed = {**log_lib.read_consumed(log_dir), **log_lib.read_quarantined(log_dir)}
  accepted: set[log_lib.SampleKey] = set()
  groups: dict[str, list[Trajectory]] = {}
  bad: list[tuple[Trajectory, TrajectoryError]] = []
  report = log_lib.LogReadReport()
  for record in log_lib.read_records(log_dir, report):
    if record.key in accepted:
      continue
    accepted.add(record.key)
    if record.key in consumed:
      continue
    try:
      if limits is not None:
        limits.check(record.trajectory, _MAX_RESTORED_VERSION)
    except TrajectoryError as e:
      bad.append((record.trajectory, e))
      continue
    groups.setdefault(record.trajectory.group_id, []).append(record.trajectory)
  # A group missing a quarantined sample could never complete (its key is taken): its mates go with it.
  for traj, error in list(bad):
    for mate in groups.pop(traj.group_id, []):
      bad.append((mate, TrajectoryError(error.field, error.reason_code,
                                        f"group mate (sample {traj.sample_index}) quarantined: {error.detail}")))
  if not report.lossless:
    logger.error("restore: reading the trajectory log %s lost %d spans (%d bytes) and %d undecodable records; "
                 "%d records read", log_dir, report.skipped_spans, report.skipped_bytes, report.undecodable,
                 report.records)
  dropped = 0
  for group_id, trajs in groups.items():
    size = dispenser.group_size_of(group_id)
    if len(trajs) < size:
      states = [dispenser.restore_sample(t) for t in trajs]
      if states[-1] is None:
        dropped += len(trajs)
        logger.warning("restore: partial group %s (%d of %d samples) is unknown to the dispenser; not buffered "
                       "(its task is leased afresh)", group_id, len(trajs), size)
        continue
      complete = any(states)
    else:
      complete = True
    buffer.reserve(group_id, size, force=True)
    for t in trajs:
      buffer.add(t)
    if complete:
      buffer.close(group_id)
  if buffer.occupancy > buffer.capacity:
    logger.warning("restore: %d trajectories restored exceed buffer_capacity %d", buffer.occupancy, buffer.capacity)
  return RestoreResult(accepted, len(consumed.keys() & accepted), dropped, bad, report)
