"""The engine's stalls in an `experiments/bench/bench_pipeline.py --out` measurement, derived from its trajectory
records.

The local JAX engine runs its batches one at a time in one worker thread, and compiles (or loads from the
persistent cache) every new batch shape the first time it meets it: meanwhile it serves nobody. The bench does not
see compilations, but every trajectory the trainer took carries its lease time and its agent loop's own seconds
(`taken`: leased_at, total_s, generate_s, tool_s, turns; times in seconds from the first measured step's wait):

- A trajectory is *stalled* when its engine seconds exceed `STALL_FACTOR` × the median over the taken
  trajectories (in the recorded runs the median is 0.04-0.05 s for five turns, the threshold 0.21-0.27 s, and a
  stalled trajectory spent 0.3-30 s there).
- Its *engine phase* is the end of its episode: the agent loop resets the environment (the bench's delay), then
  plays its turns, so the turns (engine calls and env steps, `generate_s + tool_s` seconds) end at
  `leased_at + total_s` (the worker starts an episode within milliseconds of its lease).
- The engine was stalled for most of every stalled phase; it was *serving* just before every episode's end (its
  last turn: one unstalled turn's engine and env seconds, the mean over the unstalled trajectories).

The stalls are the union of the stalled phases less the serving moments: between two serving moments every
request waits, as the engine's one thread compiles. Each waiting turn then gets one turn's service at the next
serving moment, as a batch the engine finally runs serves each request in it once.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from sao.simulation.stalls import merge

STALL_FACTOR = 5.0


def timed_rows(measured: Mapping[str, Any]) -> list[Mapping[str, Any]]:
  """Every taken trajectory with a lease time and the agent loop's timings (warm-up ones included)."""
  return [t for t in measured.get("taken", ()) if math.isfinite(t["leased_at"])
          and all(math.isfinite(t[k]) for k in ("generate_s", "tool_s", "total_s"))]


def stall_threshold_s(measured: Mapping[str, Any], factor: float = STALL_FACTOR) -> float | None:
  """Engine seconds per episode above which a trajectory is stalled: `factor` × the median over every taken
  trajectory. None without per-trajectory records."""
  if factor <= 1.0:
    raise ValueError(f"stall_threshold_s: factor must be > 1 (a multiple of the median), got {factor}")
  rows = timed_rows(measured)
  if not rows:
    return None
  return factor * float(np.median([t["generate_s"] for t in rows]))


def first_lease_s(measured: Mapping[str, Any]) -> float:
  """When the bench leased its first training task (the simulated run's time 0), on the bench's clock: the
  recorded `timeline.first_lease` (bench_pipeline.py since it recorded it), else the earliest taken lease."""
  first = measured.get("timeline", {}).get("first_lease")
  rows = timed_rows(measured)
  if first is None:
    if not rows:
      raise ValueError("bench measurement has no trajectory records (`taken`) and no timeline.first_lease")
    return min(t["leased_at"] for t in rows)
  if any(t["leased_at"] < first for t in rows):
    raise ValueError(f"bench measurement: a trajectory was leased before timeline.first_lease ({first} s)")
  return float(first)


def derive_stalls(measured: Mapping[str, Any], factor: float = STALL_FACTOR) -> list[tuple[float, float]]:
  """The engine's stalls (module docstring) as disjoint (start, end) pairs in time order, in seconds on the bench's
  clock (from the first measured step's wait), none before the first lease. [] without trajectory records."""
  threshold = stall_threshold_s(measured, factor)
  if threshold is None:
    return []
  rows = timed_rows(measured)
  origin = first_lease_s(measured)
  ends = [t["leased_at"] + t["total_s"] for t in rows]
  phases = merge([(max(origin, end - t["generate_s"] - t["tool_s"]), end)
                  for t, end in zip(rows, ends) if t["generate_s"] > threshold])
  unstalled = [t for t in rows if t["generate_s"] <= threshold]
  turn_s = float(np.mean([(t["generate_s"] + t["tool_s"]) / max(1, t["turns"]) for t in unstalled])) \
      if unstalled else 0.0
  serving = merge([(end - turn_s, end) for end in ends]) if turn_s > 0 else []
  return subtract(phases, serving)


def subtract(intervals: Sequence[tuple[float, float]],
             holes: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
  """`intervals` less `holes` (each disjoint and in time order): the non-empty pieces left, in time order."""
  out, j = [], 0
  for start, end in intervals:
    while j < len(holes) and holes[j][1] <= start:
      j += 1
    t, k = start, j
    while k < len(holes) and holes[k][0] < end:
      if holes[k][0] > t:
        out.append((t, holes[k][0]))
      t = max(t, holes[k][1])
      k += 1
    if t < end:
      out.append((t, end))
  return out


def simulated_stalls(stalls: Sequence[tuple[float, float]], first_lease: float,
                     window_start: float | None = None) -> tuple[tuple[float, float], ...]:
  """`stalls` (bench clock) on the simulated run's clock (seconds from its first lease). Stalls before the
  measured window (the warm-up's compilations) keep their time from the first lease; stalls in the window keep
  their time from the window's start, which the simulated run reaches at `window_start` (None: as the bench did,
  at −first_lease; ∞: leave them out), so that they meet the simulated trainer in the same phase as the real ones.
  A stall going on at the window's start is cut there, its two parts placed so."""
  shift = -first_lease if window_start is None else window_start
  out = []
  for start, end in stalls:
    if start < 0.0:  # its part before the window (a stall going on at the window's start is cut there)
      out.append((max(0.0, start - first_lease), min(end, 0.0) - first_lease))
    if end > 0.0 and math.isfinite(shift):
      out.append((max(0.0, start) + shift, end + shift))
  return tuple((a, b) for a, b in merge(out) if b > a)
