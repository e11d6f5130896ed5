"""A run's metric log (`<workdir>/metrics.jsonl`) as a model, and the quantities the write-up's tables and figures
are computed from (validation summaries, trajectory counts, normalised time, cost ratios, selected critic traces).

Steps. The trainer numbers steps across phases (value pretraining, then RL). Here `step` means the RL step: the
logged step minus the first step tagged `phase/rl` (so a stabilized run's 20 value-pretraining steps do not shift
its windows against an initial-recipe run's; validation of the base policy taken during pretraining gets a negative
step). Logs without phase tags are used as they are.

Trajectories. A step's trajectories are `batch/num_trajectories + dropped` (trained + dropped), counted over RL
steps only; the write-up likewise excludes critic-initialization training. Validation is a success rate in [0, 1]
in the log and a percentage in the tables.

`reported` is the write-up's data (`experiments/paper/reported.py`'s `ALL`), passed in because `sao.analysis`
does not import `experiments`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Any, Mapping, Sequence

import numpy as np

from sao.analysis import critic_traces as traces_lib
from sao.analysis.curves import EVAL_RECORD_KEY, read_metrics

METRICS_FILE = "metrics.jsonl"
EVALUATION_DIR = "evaluation"  # `experiments/evaluate.py`'s results for a run's policies: <workdir>/evaluation/vN.json
EV_KEY = "critic/explained_variance"
BEHAVIOUR_KEYS = ("turns", "response_length", "reward")


@dataclasses.dataclass
class RunLog:
  """One run's metric records, with `step` re-indexed to RL steps (see the module docstring)."""
  name: str
  workdir: str
  records: list[dict]
  step_offset: int = 0
  traces: list[traces_lib.CriticTrace] = dataclasses.field(default_factory=list)  # <workdir>/critic_traces.jsonl

  def series(self, key: str, require: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(RL steps, values) of the records with a finite `key` (and, if given, a `require` key)."""
    points = [(r["step"] - self.step_offset, float(r[key])) for r in self.records
              if r.get(key) is not None and math.isfinite(float(r[key])) and (require is None or require in r)]
    if not points:
      return np.zeros(0, np.int64), np.zeros(0)
    steps, values = zip(*points)
    return np.asarray(steps, np.int64), np.asarray(values, np.float64)

  def evaluations(self) -> tuple[np.ndarray, np.ndarray]:
    """(RL steps, success rates) of the evaluations: the records marked with `EVAL_RECORD_KEY` when the log has
    them (progress rows repeat the latest value), else every `validation` (older logs)."""
    steps, values = self.series("validation", require=EVAL_RECORD_KEY)
    return (steps, values) if values.size else self.series("validation")


def load_run(name: str, workdir: str) -> RunLog:
  """Reads `<workdir>/metrics.jsonl`; raises FileNotFoundError / ValueError naming the run when it has no metrics."""
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"run {name!r}: workdir {workdir!r} has no {METRICS_FILE}")
  records = read_metrics(path)
  if not records:
    raise ValueError(f"run {name!r}: {path} holds no metric records")
  rl_steps = [r["step"] for r in records if r.get("phase/rl")]
  offset = min(rl_steps) if rl_steps else 0
  traces_path = os.path.join(workdir, traces_lib.TRACES_FILE)
  traces = traces_lib.read_traces(traces_path) if os.path.isfile(traces_path) else []
  for t in traces:
    t.step -= offset  # RL steps, like the metrics
  return RunLog(name, workdir, records, step_offset=offset, traces=traces)


def normalized_hours(run: RunLog, scale: float = 1.0) -> dict[int, float]:
  """RL step (≥ 0) → wall-clock hours since the first RL step's record, × `scale`.

  The write-up normalises time by assuming linear concurrency scaling; toy runs compared on one machine share
  their resources, so `scale` is 1 unless runs used different hardware (pass resources / reference resources)."""
  times: dict[int, float] = {}
  for r in run.records:
    step = r["step"] - run.step_offset
    if step >= 0 and r.get("time") is not None and step not in times:
      times[step] = float(r["time"])
  if not times:
    return {}
  start = times[min(times)]
  return {s: scale * (t - start) / 3600.0 for s, t in sorted(times.items())}


def step_seconds(run: RunLog) -> float:
  """Mean wall-clock seconds per RL step (NaN with fewer than two timed steps)."""
  hours = normalized_hours(run)
  if len(hours) < 2:
    return float("nan")
  steps = sorted(hours)
  return 3600.0 * (hours[steps[-1]] - hours[steps[0]]) / (steps[-1] - steps[0])


def trajectories_per_step(run: RunLog) -> tuple[np.ndarray, np.ndarray]:
  """(RL steps ≥ 0, trajectories consumed at that step)."""
  steps, trained = run.series("batch/num_trajectories")
  counts = dict(zip(steps.tolist(), trained.tolist()))
  for step, dropped in zip(*run.series("dropped")):
    if step in counts:
      counts[step] += dropped
  keep = sorted(s for s in counts if s >= 0)
  return np.asarray(keep, np.int64), np.asarray([counts[s] for s in keep], np.float64)


def trajectories_through(run: RunLog, step: int) -> float:
  """Trajectories consumed by RL steps 0..step (NaN when the log has no batch counts)."""
  steps, counts = trajectories_per_step(run)
  if not steps.size:
    return float("nan")
  return float(counts[steps <= step].sum())


@dataclasses.dataclass(frozen=True)
class ValidationSummary:
  first: float  # the first recorded validation (the base policy's), in %
  best: float
  best_step: int
  final: float
  last_five_mean: float
  count: int




def validation_summary(run: RunLog) -> ValidationSummary | None:
  """Summary over the run's evaluations (the evaluation records when the log has them, else every `validation`)."""
  steps, values = run.evaluations()
  if not values.size:
    return None
  pct = 100.0 * values
  best = int(np.argmax(pct))  # the first occurrence of the best score
  return ValidationSummary(first=float(pct[0]), best=float(pct[best]), best_step=int(steps[best]),
                           final=float(pct[-1]), last_five_mean=float(pct[-5:].mean()), count=int(pct.size))


def first_step_reaching(run: RunLog, threshold: float, key: str = "validation", scale: float = 100.0) -> int | None:
  """The first RL step whose `key` (× `scale`) is ≥ threshold; None if never."""
  steps, values = run.series(key)
  hits = np.flatnonzero(scale * values >= threshold)
  return int(steps[hits[0]]) if hits.size else None


def window_mean(run: RunLog, key: str, n: int = 20, last: bool = False) -> float:
  """Mean of `key` over its first (or last) `n` observed RL-step points (NaN when none)."""
  steps, values = run.series(key)
  values = values[steps >= 0]
  values = values[-n:] if last else values[:n]
  return float(values.mean()) if values.size else float("nan")


def range_mean(run: RunLog, key: str, lo: int, hi: int) -> float:
  """Mean of `key` over RL steps in [lo, hi] (NaN when none)."""
  steps, values = run.series(key)
  values = values[(steps >= lo) & (steps <= hi)]
  return float(values.mean()) if values.size else float("nan")


def selected_examples(traces: Sequence[traces_lib.CriticTrace]
                      ) -> tuple[traces_lib.CriticTrace | None, traces_lib.CriticTrace | None]:
  """Table 5's / Figure 7's examples: the last step's (success, failure) pair — the most-trained critic's view —
  or, when no step dumped both, the last success and the last failure (None where a kind is absent)."""
  pairs = traces_lib.pairs_by_step(traces)
  if pairs:
    return pairs[-1]
  last = {t.kind: t for t in sorted(traces, key=lambda t: t.step)}
  return last.get("success"), last.get("failure")


def cost_ratios(sao: RunLog, gspo: RunLog, reported: Mapping[str, Any]) -> dict[str, tuple[float, float | None]]:
  """Figure 1: SAO's costs relative to GSPO = 100 as {measure: (this pair of runs, the write-up's)}."""
  sampling = reported.get("sampling", {})
  paper_traj, paper_rollouts = sampling.get("trajectories_to_best", {}), sampling.get("rollouts_per_step", {})

  def ratio(a: float, b: float) -> float:
    return 100.0 * a / b if b and math.isfinite(a) and math.isfinite(b) else float("nan")

  def to_best(run: RunLog) -> float:
    v = validation_summary(run)
    return trajectories_through(run, max(v.best_step, 0)) if v else float("nan")

  def per_step(run: RunLog) -> float:
    _, counts = trajectories_per_step(run)
    return float(np.median(counts)) if counts.size else float("nan")

  duration = sampling.get("step_duration_ratio")
  return {
      "trajectories to best": (ratio(to_best(sao), to_best(gspo)),
                               ratio(paper_traj["sao"], paper_traj["gspo"]) if paper_traj else None),
      "step duration": (ratio(step_seconds(sao), step_seconds(gspo)), 100.0 / duration if duration else None),
      "rollouts per step": (ratio(per_step(sao), per_step(gspo)),
                            ratio(paper_rollouts["sao"], paper_rollouts["gspo"]) if paper_rollouts else None),
  }


# ------------------------------------------------------------------------------------------- re-measured policies
_VERSION_DIR = re.compile(r"^v(\d+)$")


def final_policy_dir(workdir: str) -> str:
  """The run's final exported policy: `<workdir>/policy/v<N>` with the highest N; FileNotFoundError if none."""
  root = os.path.join(workdir, "policy")
  versions = [int(m.group(1)) for d in (os.listdir(root) if os.path.isdir(root) else [])
              if (m := _VERSION_DIR.match(d)) and os.path.isdir(os.path.join(root, d))]
  if not versions:
    raise FileNotFoundError(f"{workdir!r} has no exported policy (policy/v<N>)")
  return os.path.join(root, f"v{max(versions)}")


def evaluation_path_for(policy_dir: str) -> str:
  """Where `experiments/evaluate.py` writes a policy's results: `<run dir>/evaluation/<vN | base_model>.json` for a
  policy inside a run directory, "" for any other directory."""
  policy_dir = os.path.abspath(policy_dir)
  name, parent = os.path.basename(policy_dir), os.path.dirname(policy_dir)
  if _VERSION_DIR.match(name) and os.path.basename(parent) == "policy":
    return os.path.join(os.path.dirname(parent), EVALUATION_DIR, f"{name}.json")
  if name == "base_model":
    return os.path.join(parent, EVALUATION_DIR, f"{name}.json")
  return ""


def final_evaluation(workdir: str) -> tuple[str, dict[str, dict]] | None:
  """(policy name `vN`, {split: results}) of the highest-version `evaluation/vN.json`; None when there is none."""
  root = os.path.join(workdir, EVALUATION_DIR)
  found = [(int(m.group(1)), f) for f in (os.listdir(root) if os.path.isdir(root) else [])
           if (m := re.match(r"^v(\d+)\.json$", f))]
  if not found:
    return None
  version, name = max(found)
  with open(os.path.join(root, name), encoding="utf-8") as f:
    return f"v{version}", json.load(f)


@dataclasses.dataclass(frozen=True)
class JobSpeed:
  """A run's RL-step wall time beside the size of what its steps trained (`job_speed`)."""
  name: str
  steps: int  # RL step intervals measured
  median_step_s: float
  mean_step_s: float
  response_length: float  # median over the measured steps of the batch's mean action tokens per trajectory
  trained_tokens: float  # median over them of the tokens the learner trained: grouped, else the padded [B, T]
  validation_base: float  # the base policy's validation, the mean of the last 3 evaluations, the best (fractions)
  validation_last3: float
  validation_best: float


def job_speed(run: RunLog, last: int = 239) -> JobSpeed:
  """The last `last` intervals between consecutive RL steps' progress rows (the README job's 240 RL steps give
  239), with the response length and the trained tokens of those steps. The step time of the toy job scales with
  how long the policy's responses are, and that moves run to run (the same tree and seed: ≈ 20 or ≈ 54 action
  tokens per trajectory; docs/performance.md, 2026-12-04, commit 9fd1a0b), so a speed ratio compares runs of like
  lengths."""
  rows = sorted((r["step"] - run.step_offset, r) for r in run.records
                if r.get("phase/rl") and "reward" in r and r.get("time") is not None)
  if len(rows) < 2:
    raise ValueError(f"run {run.name!r}: fewer than two RL steps with a progress row")
  rows = rows[-(last + 1):]
  times = np.asarray([float(r["time"]) for _, r in rows])
  intervals = np.diff(times)
  later = [r for _, r in rows[1:]]
  lengths = [float(r["response_length"]) for r in later if r.get("response_length") is not None]
  tokens = [float(r["batch/grouped_padded_tokens"]) if "batch/grouped_padded_tokens" in r else
            float(r["batch/padded_rows"]) * float(r["batch/padded_length"]) for r in later
            if "batch/grouped_padded_tokens" in r or "batch/padded_rows" in r]
  _, evals = run.evaluations()
  base, last3, best = (float(evals[0]), float(evals[-3:].mean()), float(evals.max())) if evals.size else (math.nan,) * 3
  return JobSpeed(run.name, int(intervals.size), float(np.median(intervals)), float(np.mean(intervals)),
                  float(np.median(lengths)) if lengths else math.nan, float(np.median(tokens)) if tokens else math.nan,
                  base, last3, best)
