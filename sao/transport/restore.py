"""Restart: rebuild the server's buffer and idempotency keys from the durable trajectory log.

Every logged key is remembered (a re-send of it stays a DUPLICATE); logged records the learner never consumed are
buffered again, as whole units: a complete group (or SAO sample) goes to the ready queue; a partial group goes back
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
from sao.transport.dispenser import TaskDispenser
from sao.transport.group_buffer import GroupBuffer
from sao.transport.trajectory import Trajectory

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class RestoreResult:
  """What a restore found: every logged key, how many of them were consumed, how many partial-group samples were
  dropped."""
  accepted_keys: set[log_lib.SampleKey]
  num_consumed: int
  num_dropped: int


def restore_buffer(log_dir: str | os.PathLike, dispenser: TaskDispenser, buffer: GroupBuffer) -> RestoreResult:
  """Buffers the accepted-but-unconsumed records of the log in `log_dir` (see the module docstring)."""
  consumed = log_lib.read_consumed(log_dir)
  accepted: set[log_lib.SampleKey] = set()
  groups: dict[str, list[Trajectory]] = {}
  for record in log_lib.read_records(log_dir):
    if record.key in accepted:
      continue
    accepted.add(record.key)
    if record.key not in consumed:
      groups.setdefault(record.trajectory.group_id, []).append(record.trajectory)
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
  return RestoreResult(accepted, len(consumed.keys() & accepted), dropped)
