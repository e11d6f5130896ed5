"""Engine stalls: intervals of simulated time in which the engines serve nothing, for every episode at once.

A JAX engine compiles each new shape once, and every request waits while it does; an SGLang server captures its
CUDA graphs at start-up and after a restart. Neither slows generation down: the engines stop, and resume where they
were. So a generation of `work` engine-seconds that starts at `t` finishes at the least `f` with

    f − t − |[t, f] ∩ stalls| = work,

i.e. a turn in flight when a stall begins keeps its remaining engine work for after the stall, and a turn that
starts during a stall waits for its end (`StallSchedule.finish`). Tool calls and setups run on through a stall.

A schedule is explicit intervals (`StallModel.intervals`, e.g. derived from a measurement by
`sao.simulation.bench_stalls`) and/or a renewal process: stalls of `duration_s` separated by gaps of
`gap_s` (the first starts after one gap), drawn from their own random stream so that adding stalls leaves every
episode's and step's draws unchanged. Overlapping intervals are merged.
"""
from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Sequence

import numpy as np

from sao.simulation.distributions import Distribution

# Mixed into the run's seed for the stall process's random stream (any constant apart from the episodes' stream).
_STALL_STREAM = 0x57A11


@dataclasses.dataclass(frozen=True)
class StallModel:
  """Where the engines stall (module docstring). Empty (the default): they never do.

  Attributes:
    intervals: explicit (start, end) stalls in simulated seconds from the run's start (its first lease call).
    gap_s, duration_s: a renewal process of stalls, both or neither: a gap, a stall, a gap, ...
  """
  intervals: tuple[tuple[float, float], ...] = ()
  gap_s: Distribution | None = None
  duration_s: Distribution | None = None

  def __post_init__(self):
    for interval in self.intervals:
      if len(interval) != 2 or not all(math.isfinite(x) for x in interval) or not 0 <= interval[0] < interval[1]:
        raise ValueError(f"StallModel.intervals: each stall must be (start, end) with 0 <= start < end, both "
                         f"finite; got {interval!r}")
    object.__setattr__(self, "intervals", tuple((float(a), float(b)) for a, b in self.intervals))  # hashable
    if (self.gap_s is None) != (self.duration_s is None):
      raise ValueError("StallModel: give both gap_s and duration_s (a stall process) or neither")
    if self.gap_s is not None and not self.gap_s.mean() > 0:
      raise ValueError(f"StallModel.gap_s must have a positive mean (else the engines never serve), got "
                       f"{self.gap_s}")

  @property
  def active(self) -> bool:
    return bool(self.intervals) or self.gap_s is not None


def merge(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
  """The union of `intervals` as disjoint (start, end) pairs in time order (touching ones joined)."""
  out: list[tuple[float, float]] = []
  for start, end in sorted(intervals):
    if out and start <= out[-1][1]:
      out[-1] = (out[-1][0], max(out[-1][1], end))
    else:
      out.append((start, end))
  return out


def run_turns(finish, name: str, start: float, engine_s: Sequence[float], other_s: Sequence[float]) -> float:
  """When turns that start at `start` end: for each i, `finish(t, engine_s[i])` (when that much engine work, begun at
  t, is done on the clock `finish` belongs to), then other_s[i] seconds of a tool call at full speed."""
  if len(engine_s) != len(other_s):
    raise ValueError(f"{name}: {len(engine_s)} generations but {len(other_s)} tool calls")
  t = start
  for gen, other in zip(engine_s, other_s):
    t = finish(t, float(gen)) + float(other)
  return t


class StallSchedule:
  """One run's stalls: `model`'s explicit intervals merged with its process's draws, generated as far as asked."""

  def __init__(self, model: StallModel, seed: int):
    self.model = model
    self._explicit = merge(model.intervals)
    self._drawn: list[tuple[float, float]] = []
    self._rng = np.random.default_rng([seed, _STALL_STREAM])
    # Every stall that starts before `_known_until` is in `_stalls` (the process's next start, or ∞ without one).
    self._known_until = math.inf
    if model.gap_s is not None:
      self._known_until = self._gap()
    self._stalls = list(self._explicit)
    self._ends = [end for _, end in self._stalls]

  def _gap(self) -> float:
    return float(self.model.gap_s.sample(self._rng))

  def _extend(self, until: float) -> None:
    """Draws the process's stalls until the next one starts after `until` (at least twice as far as known)."""
    if self._known_until > until:
      return
    target = max(until, 2.0 * self._known_until)
    while self._known_until <= target:
      start = self._known_until
      end = start + max(0.0, float(self.model.duration_s.sample(self._rng)))
      if end > start:
        self._drawn.append((start, end))
      self._known_until = end + self._gap()
    self._stalls = merge(self._explicit + self._drawn)
    self._ends = [end for _, end in self._stalls]

  def finish(self, start: float, work: float) -> float:
    """When `work` engine-seconds that start at `start` are done, the engines serving nothing during stalls."""
    t, remaining = start, work
    while True:
      self._extend(t + remaining)
      i = bisect.bisect_right(self._ends, t)  # the first stall that ends after t
      if i == len(self._stalls):
        return t + remaining
      begin, end = self._stalls[i]
      if begin > t and begin >= t + remaining:  # done before it starts
        return t + remaining
      remaining -= max(0.0, begin - t)  # served until it starts (nothing if t is inside it), then resumed
      t = end

  def run(self, start: float, engine_s: Sequence[float], other_s: Sequence[float]) -> float:
    """When a sequence of turns that starts at `start` ends: engine_s[i] engine-seconds (through the stalls), then
    other_s[i] seconds of a tool call (which runs on through a stall), for each i in order."""
    return run_turns(self.finish, "StallSchedule.run", start, engine_s, other_s)

  def state_at(self, t: float) -> tuple[bool, float]:
    """(whether the engines stall at t, a time before which that does not change: the stall's end, else the next
    stall's start as far as drawn, ∞ when no stall follows)."""
    self._extend(t)
    i = bisect.bisect_right(self._ends, t)  # the first stall that ends after t
    if i < len(self._stalls) and self._stalls[i][0] <= t:
      return True, self._stalls[i][1]
    following = self._stalls[i][0] if i < len(self._stalls) else math.inf
    return False, min(following, self._known_until)

  def overlaps(self, start: float, end: float) -> bool:
    """Whether any stall intersects [start, end] (a half-open test: a stall that ends at `start` does not)."""
    self._extend(end)
    i = bisect.bisect_right(self._ends, start)
    return i < len(self._stalls) and self._stalls[i][0] <= end

  def stalled_s(self, start: float, end: float) -> float:
    """Seconds of [start, end] the engines spend stalled."""
    self._extend(end)
    i = bisect.bisect_right(self._ends, start)
    total = 0.0
    while i < len(self._stalls) and self._stalls[i][0] < end:
      begin, stop = self._stalls[i]
      total += min(stop, end) - max(begin, start)
      i += 1
    return total
