"""The simulator against the real pipeline: predictions for an `experiments/bench/bench_pipeline.py --out=...`
measurement.

The simulator is given what the bench measured as *inputs*: the episode delay distribution (the same capped Pareto
`slow_number_search` sleeps), the mean turns, the agent loop's mean engine and env-step seconds per turn (the
trajectories' own timings; with per-trajectory records, of the trajectories leased in the measured window only,
`steady_state_timings`), the transport's share (mean lease-to-acceptance time minus the agent loop's mean total,
spent between the episode's end and its submission), the trainer's step times (resampled; the warm-up steps' own
times, compilations included), where in its step a new version lands on the engine (which stamps trajectories
with it) and on the server (which counts staleness against it; the rest of the step is bookkeeping), and the
service knobs. It *predicts* what the bench reports: trajectories/s, the trainer's busy fraction and the mean
staleness of trained batches. `compare` puts the two side by side with relative errors.

With per-trajectory records the twin also gets the engine's stalls (`sao.simulation.bench_stalls`: compilations,
in which the engine serves nobody), and its per-turn engine time comes from the steady-state trajectories that were
not stalled and ran outside the trainer's steps; those that ran inside one give the factor by which the engine
slows while the trainer computes (`sao.simulation.bench_contention`). Stalls of the warm-up keep their time from the
first lease; those in the measured window keep their time from the window's start, so `simulate_bench` runs a seed
twice: with the warm-up's stalls only, to find where the simulated window starts, then with the window's stalls
from there (they cannot change the warm-up).
"""
from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from sao.simulation import bench_contention, bench_stalls
from sao.simulation.distributions import Distribution
from sao.simulation.fleet import simulate
from sao.simulation.model import EpisodeModel, FleetConfig
from sao.simulation.report import FleetReport
from sao.simulation.stalls import StallModel

# staleness_steady_mean: over the trajectories leased after the first measured step began (the bench's per-trajectory
# records), so no episode of the warm-up, whose engine calls waited for the engine's compilations, counts.
METRICS = ("traj_per_s", "busy", "staleness_mean", "staleness_steady_mean")
# The bench's fixed settings not in its JSON (experiments/bench/bench_pipeline.py and the toy config): the empty-lease
# retry it sets, the toy lease TTL, and SAO's critic warm-up (its first update leaves the policy version as is).
BENCH_NO_WORK_RETRY_S = 0.05
BENCH_LEASE_TTL_S = 120.0
BENCH_ACTOR_WARMUP_STEPS = 1


# What the validation reads of a measurement (`bench_config`, `measured_metrics`, the command's table): `trimmed`
# keeps these and drops the rest (the per-trajectory staleness list, publish times, each record's step and take time).
READ_KEYS = ("mode", "concurrency", "batch_size", "steps", "warmup_steps", "delay", "episode_s", "train_step_s",
             "warmup_train_step_s", "turns_mean", "generate_s_mean", "tool_s_mean", "total_s_mean", "max_outstanding",
             "buffer_capacity", "max_staleness", "publish_fraction_mean", "engine_publish_fraction_mean", "timeline",
             "taken", "loadavg_before", "loadavg_after") + METRICS
READ_RECORD_KEYS = ("leased_at", "accepted_at", "policy_version", "server_version", "turns", "generate_s", "tool_s",
                    "total_s")


def trimmed(measured: Mapping[str, Any], decimals: int = 6) -> dict[str, Any]:
  """`measured` with only `READ_KEYS` (and of each `taken` record `READ_RECORD_KEYS`), every float rounded to `decimals`
  places (seconds: to the microsecond by default, far below the bench's own noise): what the repository keeps of a bench
  measurement so that `simulate_fleet.py --validate` re-runs from it."""
  def rounded(value):
    if isinstance(value, float):
      return round(value, decimals)
    if isinstance(value, (list, tuple)):
      return [rounded(v) for v in value]
    if isinstance(value, Mapping):
      return {k: rounded(v) for k, v in value.items()}
    return value

  out = {k: rounded(measured[k]) for k in READ_KEYS if k in measured}
  if "taken" in out:
    out["taken"] = [{k: t[k] for k in READ_RECORD_KEYS if k in t} for t in out["taken"]]
  return out


def bench_config(measured: Mapping[str, Any], seed: int = 0, stalls: bool = True,
                 window_start_s: float | None = None, contention: bool = True) -> FleetConfig:
  """The simulated twin of one bench mode's measurement (module docstring). `stalls` False: no engine stalls, and
  the per-turn engine time is the mean over all steady-state trajectories (the simulator before stalls existed).
  window_start_s: where the simulated measured window starts (`bench_stalls.simulated_stalls`; None: as measured).
  contention False: the engine runs at one speed (`bench_contention`: else, with per-trajectory records, at the
  idle turns' speed, slowed by the measured factor while the trainer computes)."""
  for key in ("concurrency", "batch_size", "steps", "warmup_steps", "delay", "episode_s", "train_step_s",
              "turns_mean", "max_outstanding", "buffer_capacity", "max_staleness"):
    if key not in measured:
      raise ValueError(f"bench measurement has no {key!r} (run experiments/bench/bench_pipeline.py with --out)")
  if measured.get("mode", "async") != "async":
    raise ValueError(f"only the bench's async mode is simulated, got mode {measured['mode']!r}")
  d = measured["delay"]
  if d.get("kind") != "pareto":
    raise ValueError(f"bench delay kind {d.get('kind')!r}: only 'pareto' (slow_number_search) is known")
  delay = Distribution("pareto", float(d["scale_s"]), float(d["alpha"]), hi=float(d["max_s"]))
  if not measured["episode_s"] or not measured["train_step_s"]:
    raise ValueError("bench measurement has no episode or step times")
  threshold = bench_stalls.stall_threshold_s(measured) if stalls else None
  steady = steady_state_timings(measured, max_engine_s=math.inf if threshold is None else threshold)
  stall_model, trainer_contention = StallModel(), 1.0
  if threshold is not None and steady is not None:  # else the step means below carry the stalls' time already
    stall_model = StallModel(intervals=bench_stalls.simulated_stalls(
        bench_stalls.derive_stalls(measured), bench_stalls.first_lease_s(measured), window_start_s))
  if steady is not None:
    # Per trajectory, only those leased in the measured window: the agent loop's seconds and lease-to-acceptance
    # of the steady state, not of the first episodes, whose engine calls wait for its compilations (they are
    # taken in the first measured steps, so the step-averaged `generate_s_mean` carries them); with stalls, only
    # the unstalled ones (the stalls' time is in the stall schedule).
    turns = max(1, int(round(steady["turns"])))
    gen_s, tool_s = steady["generate_s"] / turns, steady["tool_s"] / turns
    speed = bench_contention.engine_speed(measured, math.inf if threshold is None else threshold) \
        if contention else None
    if speed is not None:  # the turns served outside the trainer's steps; those inside, by the factor
      gen_s, trainer_contention = speed.idle_s, speed.contention
    submit_s = max(0.0, steady["lease_to_accept_s"] - steady["total_s"])
  elif "generate_s_mean" in measured:
    # The agent loop's own timings: engine time and env-step time per turn; the rest of lease-to-acceptance
    # beyond the agent loop's total is the transport's (submission, acknowledgement).
    turns = max(1, int(round(float(measured["turns_mean"]))))
    gen_s = float(measured["generate_s_mean"]) / turns
    tool_s = float(measured["tool_s_mean"]) / turns
    submit_s = max(0.0, float(np.mean(measured["episode_s"])) - float(measured["total_s_mean"]))
  else:  # older measurements: all overhead beyond the delay counts as engine time
    turns = max(1, int(round(float(measured["turns_mean"]))))
    gen_s, tool_s, submit_s = max(0.0, float(np.mean(measured["episode_s"])) - delay.mean()) / turns, 0.0, 0.0
  publish_fraction = min(1.0, max(0.0, float(measured.get("publish_fraction_mean", 1.0))))
  # Where the engine itself first reported each new version (the bench polls it): it stamps trajectories from then.
  engine_fraction = engine_publish_fraction(measured.get("timeline", {}))
  if engine_fraction is None:  # no publish records: the bench's own per-step mean
    engine_fraction = measured.get("engine_publish_fraction_mean")
  engine_fraction = (min(publish_fraction, max(0.0, float(engine_fraction)))
                     if engine_fraction is not None and math.isfinite(float(engine_fraction)) else None)
  episode = EpisodeModel(setup_s=delay, turns=Distribution("constant", turns), gen_s=Distribution("constant", gen_s),
                         tool_s=Distribution("constant", tool_s))
  return FleetConfig(
      loops=int(measured["concurrency"]), episode=episode, stalls=stall_model, submit_latency_s=submit_s,
      trainer_contention=trainer_contention,
      publish_fraction=publish_fraction, engine_publish_fraction=engine_fraction,
      step_s=Distribution("choice", values=tuple(float(t) for t in measured["train_step_s"])),
      batch_size=int(measured["batch_size"]), actor_warmup_steps=BENCH_ACTOR_WARMUP_STEPS,
      max_staleness=int(measured["max_staleness"]), max_outstanding=int(measured["max_outstanding"]),
      buffer_capacity=int(measured["buffer_capacity"]), lease_ttl_s=BENCH_LEASE_TTL_S,
      no_work_retry_s=BENCH_NO_WORK_RETRY_S, num_tasks=1000, seed=seed, max_hours=24.0,  # a stalled twin stops
      max_steps=int(measured["warmup_steps"]) + int(measured["steps"]), warmup_steps=int(measured["warmup_steps"]),
      warmup_step_s=tuple(float(t) for t in measured.get("warmup_train_step_s", ())))


def engine_publish_fraction(timeline: Mapping[str, Any]) -> float | None:
  """Mean over the measured window's publishes that the engine was seen to serve of where in the publishing step it
  first reported the new version: (t − take) / (step end − take). Each report at t is charged to the last publish
  that started at or before t (the one that sent that version) and so to the step that publish ended in, not to
  the step the bench's poller saw it in: with the trainer busy, steps run back to back and a report 10 ms after a
  step's end (poll and lock lag) falls in the next step at fraction ~0, which the bench's own
  `engine_publish_fraction_mean` averages in. t is capped at that publish's end: the trainer's publish call returns
  after the engines swapped, so a later report is the poller's lag. None without the timeline's waits, end,
  publishes and engine_versions, or with no report charged to a measured step (begin of its wait >= 0)."""
  if not all(k in timeline for k in ("waits", "end", "publishes", "engine_versions")):
    return None
  waits = [(float(b), float(w)) for b, w in timeline["waits"]]
  ends = [b for b, _ in waits[1:]] + [float(timeline["end"])]
  steps = [(w, e) for (b, w), e in zip(waits, ends) if b >= 0.0 and e > w]
  publishes = sorted((float(a), float(b)) for a, b in timeline["publishes"])
  starts = [a for a, _ in publishes]
  fractions = []
  for t, version in timeline["engine_versions"]:
    i = bisect.bisect_right(starts, float(t)) - 1
    if version <= 0 or i < 0:
      continue
    sent_by = publishes[i][1]
    for take, end in steps:
      if take <= sent_by <= end:
        fractions.append((min(float(t), sent_by) - take) / (end - take))
        break
  return float(np.mean(fractions)) if fractions else None


def steady_state_timings(measured: Mapping[str, Any], min_trajectories: int = 32,
                         max_engine_s: float = math.inf) -> dict[str, float] | None:
  """Means over the trajectories leased after the first measured step began (the bench's `taken` records, times
  relative to that moment) whose engine seconds are at most `max_engine_s` (not stalled) of: turns, the agent
  loop's generate_s, tool_s and total_s, and lease-to-acceptance seconds. None when the measurement has no
  per-trajectory records or fewer than `min_trajectories` such ones."""
  rows = [t for t in _steady_rows(measured) if t["generate_s"] <= max_engine_s]
  if len(rows) < min_trajectories:
    return None
  out = {k: float(np.mean([t[k] for t in rows])) for k in ("turns", "generate_s", "tool_s", "total_s")}
  out["lease_to_accept_s"] = float(np.mean([t["accepted_at"] - t["leased_at"] for t in rows]))
  out["trajectories"] = float(len(rows))
  return out


def _steady_rows(measured: Mapping[str, Any]) -> list[Mapping[str, Any]]:
  return [t for t in measured.get("taken", ()) if t["leased_at"] >= 0.0 and math.isfinite(t["accepted_at"])]


def measured_metrics(measured: Mapping[str, Any]) -> dict[str, float]:
  """The bench's values of `METRICS`: staleness_steady_mean only when it recorded every taken trajectory."""
  out = {k: float(measured[k]) for k in METRICS if k in measured}
  rows = _steady_rows(measured)
  if rows:
    out["staleness_steady_mean"] = float(np.mean([t["server_version"] - t["policy_version"] for t in rows]))
  return out


def predict(measured: Mapping[str, Any], seeds: Iterable[int] = range(20), stalls: bool = True,
            contention: bool = True) -> dict[str, float]:
  """The simulator's mean over `seeds` of each metric in `METRICS` for the bench's settings (`bench_config`)."""
  runs = []
  for seed in seeds:
    report = simulate_bench(measured, seed, stalls, contention)
    runs.append({"traj_per_s": report.traj_per_hour / 3600.0, "busy": report.busy,
                 "staleness_mean": report.staleness_mean, "staleness_steady_mean": report.staleness_steady_mean})
  if not runs:
    raise ValueError("predict: no seeds")
  return {k: float(np.mean([r[k] for r in runs])) for k in METRICS}


def simulate_bench(measured: Mapping[str, Any], seed: int, stalls: bool = True,
                   contention: bool = True) -> FleetReport:
  """One simulated twin of the measurement, the measured window's stalls placed from where its simulated window
  starts: found by a run with the warm-up's stalls only (module docstring)."""
  warmup = bench_config(measured, seed, stalls, window_start_s=math.inf, contention=contention)  # warm-up's stalls
  report = simulate(warmup)
  aligned = bench_config(measured, seed, stalls, window_start_s=report.measured_from_s, contention=contention)
  if aligned.stalls == warmup.stalls:
    return report
  start = report.measured_from_s
  report = simulate(aligned)
  if abs(report.measured_from_s - start) > 1e-6:  # the window's stalls start in it: they cannot move its start
    raise RuntimeError(f"simulate_bench: the measured window moved from {start} s to {report.measured_from_s} s")
  return report


@dataclasses.dataclass(frozen=True)
class Comparison:
  """One metric: the simulator's prediction next to the measurement."""
  metric: str
  predicted: float
  measured: float

  @property
  def relative_error(self) -> float:
    """|predicted − measured| / |measured| (0 when both are 0, inf when only the measurement is)."""
    if self.measured == 0:
      return 0.0 if self.predicted == 0 else math.inf
    return abs(self.predicted - self.measured) / abs(self.measured)

  def within(self, tolerance: float) -> bool:
    return self.relative_error <= tolerance


def compare(predicted: Mapping[str, float], measured: Mapping[str, Any],
            metrics: Sequence[str] = METRICS) -> list[Comparison]:
  """Prediction vs measurement for each of `metrics` (both mappings must have them)."""
  missing = [m for m in metrics if m not in predicted or m not in measured]
  if missing:
    raise ValueError(f"compare: metrics {missing} missing from the prediction or the measurement")
  return [Comparison(m, float(predicted[m]), float(measured[m])) for m in metrics]


def format_table(rows: Sequence[tuple[str, Sequence[Comparison]]], tolerance: float) -> str:
  """A markdown table: one line per (label, metric), with the relative error and whether it is within tolerance."""
  lines = ["| run | metric | simulated | measured | rel. error | within |", "|---|---|---|---|---|---|"]
  for label, comparisons in rows:
    for c in comparisons:
      lines.append(f"| {label} | {c.metric} | {c.predicted:.3f} | {c.measured:.3f} | {c.relative_error:.1%} | "
                   f"{'yes' if c.within(tolerance) else 'NO'} |")
  return "\n".join(lines)
