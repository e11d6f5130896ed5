"""The engines' speed over time: stalled (`sao.simulation.stalls`), slowed while the trainer computes, or full.

On one machine the local JAX engine and the trainer share the processors: while the trainer runs a step the engine
serves each turn more slowly (`experiments/bench/bench_pipeline.py` measured 1.3-2 × the engine seconds per turn for
turns served inside a training step; `sao.simulation.bench_contention`). A GPU fleet's engines do not share the
trainer's processors, so the generative grid runs without it (`FleetConfig.trainer_contention` = 1).

The engines do engine-seconds of work at a rate

    r(t) = 0                while they stall,
           1 / contention   while the trainer computes (a step: from its take to its end, publishing included),
           1                otherwise,

and a generation of `work` engine-seconds that starts at `t` finishes at the least `f` with ∫_t^f r = work. The
trainer's steps are known only as they start (a step starts when the buffer holds a batch, which depends on the
episodes): `EngineClock.add_busy` appends each step when it is taken, and the simulator then recomputes the end of
every generation in flight (`EngineClock.run` from the episode's own start: the rate before the new step is
unchanged, so only what lies after it moves).
"""
from __future__ import annotations

import bisect
import math
from typing import Sequence

from sao.simulation.stalls import StallSchedule, run_turns


class EngineClock:
  """One run's engine speed: `stalls` (None: the engines never stall) and the trainer's busy intervals, during
  which a turn's engine seconds take `contention` times as long (> 0; 1: no effect)."""

  def __init__(self, stalls: StallSchedule | None, contention: float):
    if not (math.isfinite(contention) and contention > 0):
      raise ValueError(f"EngineClock: contention must be finite and > 0, got {contention}")
    self._stalls = stalls
    self._rate_busy = 1.0 / contention
    self._busy: list[tuple[float, float]] = []  # the trainer's steps, disjoint and in time order
    self._busy_ends: list[float] = []

  def add_busy(self, start: float, end: float) -> None:
    """The trainer computes during [start, end]; steps come in time order. One that starts where the last ends
    (or a rounding error before: a step's end is the sum of its parts) joins it."""
    if not (math.isfinite(start) and start <= end):
      raise ValueError(f"EngineClock.add_busy: need a finite start <= end, got ({start}, {end})")
    if self._busy and start < self._busy[-1][0]:
      raise ValueError(f"EngineClock.add_busy: a step at {start} s starts before the last one "
                       f"({self._busy[-1][0]} s)")
    if end == start:
      return
    if self._busy and start <= self._busy[-1][1]:  # back to back: one interval
      self._busy[-1] = (self._busy[-1][0], max(end, self._busy[-1][1]))
      self._busy_ends[-1] = self._busy[-1][1]
    else:
      self._busy.append((start, end))
      self._busy_ends.append(end)

  def _busy_state(self, t: float) -> tuple[bool, float]:
    """(whether the trainer computes at t, when that changes; ∞ if it never does as far as known)."""
    i = bisect.bisect_right(self._busy_ends, t)  # the first step that ends after t
    if i == len(self._busy):
      return False, math.inf
    begin, end = self._busy[i]
    return (True, end) if begin <= t else (False, begin)

  def finish(self, start: float, work: float) -> float:
    """When `work` engine-seconds that start at `start` are done."""
    t, remaining = start, float(work)
    while True:
      stalled, stall_change = (False, math.inf) if self._stalls is None else self._stalls.state_at(t)
      if stalled:  # nothing is served until the stall ends (even a request with no work waits for it)
        t = stall_change
        continue
      busy, busy_change = self._busy_state(t)
      rate = self._rate_busy if busy else 1.0
      until = min(stall_change, busy_change)
      if remaining <= rate * (until - t):
        return t + remaining / rate
      remaining -= rate * (until - t)
      t = until

  def run(self, start: float, engine_s: Sequence[float], other_s: Sequence[float]) -> float:
    """When a sequence of turns that starts at `start` ends: engine_s[i] engine-seconds at the engines' rate, then
    other_s[i] seconds of a tool call (at full speed, through stalls and steps), for each i in order."""
    return run_turns(self.finish, "EngineClock.run", start, engine_s, other_s)
