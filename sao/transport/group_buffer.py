"""The bounded buffer of accepted, unconsumed training trajectories, with room reserved for groups still filling.

Units are complete: a single SAO sample, or a whole GSPO/GRPO group of G samples ordered by sample index, handed
out in arrival order. In group mode the first accepted sample of a group reserves G slots, so a group's later
samples are never pushed back (a buffer full of half groups would otherwise deadlock):
occupancy = ready trajectories + reserved slots of open groups <= capacity, always (restore may force past it).
"""
from __future__ import annotations

import collections

from sao.transport.trajectory import Trajectory


class GroupBuffer:
  """Complete units ready for the learner plus open groups with their reservations. Not thread-safe: the server
  guards it with its condition variable.

  Args:
    capacity: the most trajectories held, counting the reserved slots of open groups.
  """

  def __init__(self, capacity: int):
    if capacity <= 0:
      raise ValueError(f"capacity: must be > 0, got {capacity}")
    self.capacity = capacity
    self.ready: collections.deque[list[Trajectory]] = collections.deque()
    self.ready_count = 0
    self.open: dict[str, dict[int, Trajectory]] = {}
    self.open_size: dict[str, int] = {}

  @property
  def occupancy(self) -> int:
    """Ready trajectories + the reserved size of every open group."""
    return self.ready_count + sum(self.open_size.values())

  @property
  def held(self) -> int:
    """Trajectories actually held (ready + received samples of open groups)."""
    return self.ready_count + sum(len(g) for g in self.open.values())

  def reserve(self, group_id: str, size: int, force: bool = False) -> bool:
    """Opens `group_id` with `size` reserved slots (a no-op if open); False when that would exceed the capacity
    (unless `force`)."""
    if group_id in self.open:
      return True
    if not force and self.occupancy + size > self.capacity:
      return False
    self.open[group_id], self.open_size[group_id] = {}, size
    return True

  def release_if_empty(self, group_id: str) -> None:
    """Drops the reservation of an open group that received nothing (its first sample was not stored after all)."""
    if group_id in self.open and not self.open[group_id]:
      del self.open[group_id], self.open_size[group_id]

  def add(self, traj: Trajectory) -> None:
    """Adds a sample to its (reserved) open group."""
    self.open[traj.group_id][traj.sample_index] = traj

  def close(self, group_id: str) -> None:
    """Moves a complete group to the ready queue, ordered by sample index."""
    group = self.open.pop(group_id)
    del self.open_size[group_id]
    self.ready.append([group[i] for i in sorted(group)])
    self.ready_count += len(group)

  def take(self, n: int) -> list[Trajectory] | None:
    """The first `n` ready trajectories (whole units), or None when fewer are ready."""
    if self.ready_count < n:
      return None
    out: list[Trajectory] = []
    while len(out) < n:
      out.extend(self.ready.popleft())
    self.ready_count -= len(out)
    return out
