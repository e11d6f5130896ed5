"""The engine's speed while the trainer computes, from an `experiments/bench/bench_pipeline.py --out` measurement.

The bench runs the trainer, one local JAX engine and the rollout worker on one machine's processors. Its records
give the trainer's steps (`timeline.waits`: each step trains from the end of its wait for a batch to the start of
the next wait, the last one to `timeline.end`; what the bench's `train_step_s` measures) and, per trajectory taken,
its agent loop's engine seconds and turns and when its turns ran (`bench_stalls`: the turns, `generate_s + tool_s`
seconds, end at `leased_at + total_s`). Over the trajectories leased in the measured window whose engine seconds
are at most the stall threshold (`bench_stalls.stall_threshold_s`: compilations are the stall schedule's):

- *idle*: those whose turns lie wholly outside every training step; their engine seconds per turn (Σ generate_s /
  Σ turns) are the simulated engine's per-turn time;
- *busy*: those whose turns lie wholly inside one step; their engine seconds per turn over the idle ones are
  `FleetConfig.trainer_contention`, the factor by which a turn's engine time stretches while the trainer computes.

Trajectories whose turns straddle a step's start or end are in neither group. (A turn slowed by a step is longer,
so it straddles more often: the busy group leans to the less slowed, and the factor errs low, not high.) In the
twelve recorded runs the busy turns took 1.3-2.0 × the idle ones (docs/fleet_simulation.md). Nothing here looks at the metrics
the simulator is compared on (throughput, busy fraction, staleness).
"""
from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Any, Mapping

from sao.simulation import bench_stalls

# Fewest trajectories in each group for a factor: with fewer, the twin runs at one engine speed.
MIN_IDLE = 32
MIN_BUSY = 8


@dataclasses.dataclass(frozen=True)
class EngineSpeed:
  """Engine seconds per turn (Σ generate_s / Σ turns) of the steady-state unstalled trajectories whose turns ran
  wholly outside (`idle_s`, over `idle_n` trajectories) and wholly inside (`busy_s`, `busy_n`) the trainer's steps."""
  idle_s: float
  idle_n: int
  busy_s: float
  busy_n: int

  @property
  def contention(self) -> float:
    """busy_s / idle_s: `FleetConfig.trainer_contention`."""
    return self.busy_s / self.idle_s


def training_steps(measured: Mapping[str, Any]) -> list[tuple[float, float]]:
  """The trainer's steps as (start, end) on the bench's clock: from the end of each wait for a batch to the start
  of the next wait (the last: to `timeline.end`)."""
  timeline = measured.get("timeline", {})
  if "waits" not in timeline or "end" not in timeline:
    raise ValueError("bench measurement has no timeline.waits / timeline.end (run experiments/bench/bench_pipeline.py "
                     "with --out)")
  waits = timeline["waits"]
  ends = [float(begin) for begin, _ in waits[1:]] + [float(timeline["end"])]
  return [(float(waited), end) for (_, waited), end in zip(waits, ends)]


def _inside(steps: list[tuple[float, float]], starts: list[float], a: float, b: float) -> str:
  """'busy' when [a, b] lies in one step, 'idle' when it meets none, else 'mixed'."""
  i = bisect.bisect_right(starts, a) - 1  # the last step that starts at or before a
  if i >= 0 and b <= steps[i][1]:
    return "busy"
  following = steps[i + 1][0] if i + 1 < len(steps) else math.inf
  if (i < 0 or a >= steps[i][1]) and b <= following:
    return "idle"
  return "mixed"


def engine_speed(measured: Mapping[str, Any], max_engine_s: float) -> EngineSpeed | None:
  """Per-turn engine seconds outside and inside the trainer's steps (module docstring) over the trajectories
  leased in the measured window with at most `max_engine_s` engine seconds. None without per-trajectory records
  and the steps' timeline, or with fewer than `MIN_IDLE` idle or `MIN_BUSY` busy trajectories."""
  rows = [t for t in bench_stalls.timed_rows(measured) if t["leased_at"] >= 0.0 and t["generate_s"] <= max_engine_s]
  if not rows or "waits" not in measured.get("timeline", {}):
    return None
  steps = training_steps(measured)
  starts = [a for a, _ in steps]
  groups: dict[str, list[tuple[float, int]]] = {"idle": [], "busy": [], "mixed": []}
  for t in rows:
    end = t["leased_at"] + t["total_s"]
    groups[_inside(steps, starts, end - t["generate_s"] - t["tool_s"], end)].append(
        (t["generate_s"], max(1, int(t["turns"]))))
  idle, busy = groups["idle"], groups["busy"]
  if len(idle) < MIN_IDLE or len(busy) < MIN_BUSY:
    return None
  idle_s, busy_s = (sum(g for g, _ in rows) / sum(n for _, n in rows) for rows in (idle, busy))
  if not idle_s > 0:
    return None
  return EngineSpeed(idle_s, len(idle), busy_s, len(busy))
