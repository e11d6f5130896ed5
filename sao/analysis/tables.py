"""The write-up's tables from run logs (`<workdir>/metrics.jsonl`), side by side with its reported numbers.

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
import math
import os
from typing import Any, Mapping, Sequence

import numpy as np

from sao.analysis import critic_diagnostics as diag
from sao.analysis import critic_traces as traces_lib
from sao.analysis.curves import EVAL_RECORD_KEY, read_metrics

METRICS_FILE = "metrics.jsonl"
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


# ---------------------------------------------------------------------------------------------------- markdown
def fmt(value: Any, digits: int = 1) -> str:
  if value is None or (isinstance(value, float) and not math.isfinite(value)):
    return "—"
  if isinstance(value, (int, np.integer)):
    return f"{int(value):,}"
  return f"{value:,.{digits}f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in
                                                               range(len(header))) + "|"]
  lines += ["| " + " | ".join(row) + " |" for row in rows]
  return "\n".join(lines)


def validation_table(runs: Sequence[RunLog], reported: Mapping[str, Any]) -> str:
  verified, apps = reported.get("verified", {}), reported.get("applications", {})
  rows = []
  for run in runs:
    v = validation_summary(run)
    paper = apps.get(run.name, {})
    paper_first = paper.get("first", verified.get("base") if run.name in verified else None)
    paper_best = paper.get("best", verified.get(run.name) if run.name in ("sao", "gspo") else None)
    rows.append([run.name, fmt(v and v.first), fmt(paper_first), fmt(v and v.best), fmt(paper_best, 2),
                 fmt(v and v.best_step), fmt(v and v.final), fmt(paper.get("final"), 2), fmt(v and v.last_five_mean),
                 fmt(paper.get("last_five_mean"))])
  return markdown_table(["run", "first %", "reported", "best %", "reported", "best step", "final %", "reported",
                         "last-5 mean %", "reported"], rows)


def sampling_table(runs: Sequence[RunLog], reported: Mapping[str, Any], threshold: float) -> str:
  sampling = reported.get("sampling", {})
  paper_traj = sampling.get("trajectories_to_best", {})
  rows, to_best = [], {}
  for run in runs:
    v = validation_summary(run)
    traj = trajectories_through(run, v.best_step) if v else float("nan")
    to_best[run.name] = traj
    hit = first_step_reaching(run, threshold)
    hours = normalized_hours(run)
    rows.append([run.name, fmt(v and v.best_step), fmt(traj, 0), fmt(paper_traj.get(run.name)), fmt(hit),
                 fmt(trajectories_through(run, hit) if hit is not None else None, 0),
                 fmt(60.0 * hours[hit] if hit is not None and hit in hours else None)])
  text = markdown_table(["run", "step to best", "trajectories to best", "reported", f"first step ≥ {threshold:g} %",
                         "trajectories to it", "minutes to it"], rows)
  if "sao" in to_best and "gspo" in to_best and to_best["gspo"] > 0:
    reduction = 100.0 * (1.0 - to_best["sao"] / to_best["gspo"])
    text += (f"\n\nSAO vs GSPO trajectories to each one's best: {fmt(reduction)} % fewer "
             f"(reported {fmt(sampling.get('trajectory_reduction_pct'))} %).")
  return text


def behaviour_table(runs: Sequence[RunLog], window: int = 20) -> str:
  header, rows = ["run"], []
  for key in BEHAVIOUR_KEYS:
    header += [f"{key} first {window}", f"{key} last {window}"]
  for run in runs:
    row = [run.name]
    for key in BEHAVIOUR_KEYS:
      row += [fmt(window_mean(run, key, window), 2), fmt(window_mean(run, key, window, last=True), 2)]
    rows.append(row)
  return markdown_table(header, rows)


def recipe_table(runs: Mapping[str, RunLog], reported: Mapping[str, Any], ev_steps: tuple[int, int] | None = None,
                 turns_steps: tuple[int, int] | None = None) -> str:
  """Initial (`sao_initial`) vs stabilized (`sao`) recipe: EV, best validation, mean turns over step ranges."""
  recipe = reported.get("recipe", {})
  ev_steps = ev_steps or tuple(recipe.get("critic_ev_steps", (40, 100)))
  turns_steps = turns_steps or tuple(recipe.get("turns_steps", (120, 139)))
  rows = []
  for name in ("sao_initial", "sao"):
    run = runs[name]
    v = validation_summary(run)
    rows.append([name, fmt(range_mean(run, EV_KEY, *ev_steps), 3), fmt(recipe.get("critic_ev", {}).get(name), 3),
                 fmt(v and v.best), fmt(recipe.get("best_validation", {}).get(name)),
                 fmt(range_mean(run, "turns", *turns_steps)), fmt(recipe.get("turns", {}).get(name))])
  return markdown_table(["recipe", f"critic EV steps {ev_steps[0]}–{ev_steps[1]}", "reported", "best validation %",
                         "reported", f"mean turns steps {turns_steps[0]}–{turns_steps[1]}", "reported"], rows)


def selected_examples(traces: Sequence[traces_lib.CriticTrace]
                      ) -> tuple[traces_lib.CriticTrace | None, traces_lib.CriticTrace | None]:
  """Table 5's / Figure 7's examples: the last step's (success, failure) pair — the most-trained critic's view —
  or, when no step dumped both, the last success and the last failure (None where a kind is absent)."""
  pairs = traces_lib.pairs_by_step(traces)
  if pairs:
    return pairs[-1]
  last = {t.kind: t for t in sorted(traces, key=lambda t: t.step)}
  return last.get("success"), last.get("failure")


def _pct(count: int, total: int) -> str:
  return f"{100.0 * count / total:.2f} % of {total:,}" if total else "—"


def critic_table(run: RunLog, reported: Mapping[str, Any]) -> str:
  """Table 5 for one run's critic traces beside the write-up's: the selected examples' V first/last, ΔV and half
  means, success-vs-failure mean values per step, and |ΔV| > 0.1 rates at message boundaries vs within turns."""
  c = reported.get("critic", {})
  success, failure = selected_examples(run.traces)
  rows = []
  for kind, trace in (("success", success), ("failure", failure)):
    paper = c.get(f"{kind}_example", {})
    paper_text = f"{paper['first']:.3f} → {paper['last']:.3f}" if paper else "—"
    if trace is None:
      rows.append([f"{kind} example", "—", paper_text])
      continue
    s = diag.trace_summary(trace.values, trace.action_mask)
    rows.append([f"{kind} example (step {trace.step}) V first → last", f"{s.first_value:.3f} → {s.last_value:.3f}",
                 paper_text])
    rows.append([f"{kind} example ΔV; first-half / second-half mean",
                 f"{s.delta_v:+.3f}; {s.first_half_mean:.3f} / {s.second_half_mean:.3f}", "—"])
  pairs = traces_lib.pairs_by_step(run.traces)
  wins, total = diag.success_beats_failure([((a.values, a.action_mask), (b.values, b.action_mask)) for a, b in pairs])
  paper_wins = c.get("success_beats_failure")
  rows.append(["success mean > paired failure mean", f"{wins} of {total}",
               f"{paper_wins[0]} of {paper_wins[1]}" if paper_wins else "—"])
  threshold = c.get("jump_threshold", diag.JUMP_THRESHOLD)
  jumps = diag.total_jumps(diag.value_jumps(t.values, t.action_mask, t.turn_boundaries, threshold)
                           for t in run.traces)
  # `\|` keeps the absolute-value bars from splitting the markdown cell.
  rows.append([f"\\|ΔV\\| > {threshold:g} at message boundaries",
               _pct(jumps.boundary_jumps, jumps.boundary_transitions),
               f"{c['boundary_jump_rate_pct']:.2f} % of {c['boundary_transitions']:,}" if c else "—"])
  rows.append([f"\\|ΔV\\| > {threshold:g} within turns", _pct(jumps.within_jumps, jumps.within_transitions),
               f"{c['within_jump_rate_pct']:.2f} % of {c['within_transitions']:,}" if c else "—"])
  rows.append(["boundary / within-turn jump rate", f"{fmt(jumps.ratio)}×", f"{c['jump_rate_ratio']}×" if c else "—"])
  return markdown_table([f"{run.name}: {len(run.traces)} traces, "
                         f"{sum(int(t.action_mask.sum()) for t in run.traces):,} action tokens", "this run",
                         "reported"], rows)


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


def cost_table(costs: Mapping[str, tuple[float, float | None]]) -> str:
  return markdown_table(["SAO cost (GSPO = 100)", "this run", "reported"],
                        [[name, fmt(ours), fmt(paper)] for name, (ours, paper) in costs.items()])


TABLES = (1, 2, 3, 4, 5)  # the write-up's numbering: validation, sampling cost, behaviour, applications, critic
APPLICATIONS = ("sao_multilingual", "sao_mixed_harness")


def paper_tables(runs: Sequence[RunLog], reported: Mapping[str, Any], threshold: float | None = None,
                 window: int = 20, ev_steps: tuple[int, int] | None = None,
                 turns_steps: tuple[int, int] | None = None, tables: Sequence[int] | None = None) -> str:
  """The selected tables (`tables`, numbered as `TABLES`; None = every table the runs support) as one markdown
  document. Table 4 holds the additional applications' runs and, given `sao` and `sao_initial`, the recipe table."""
  if not runs:
    raise ValueError("paper_tables: no runs")
  names = [r.name for r in runs]
  if len(set(names)) != len(names):
    raise ValueError(f"paper_tables: duplicate run names {names}")
  selected = TABLES if tables is None else tuple(tables)
  unknown = [t for t in selected if t not in TABLES]
  if unknown:
    raise ValueError(f"paper_tables: unknown table(s) {unknown}; expected some of {TABLES}")
  threshold = reported.get("sampling", {}).get("threshold_pct", 68.0) if threshold is None else threshold
  by_name = {r.name: r for r in runs}
  parts = []
  if 1 in selected:
    parts += ["## Table 1 — validation (success %)", validation_table(runs, reported)]
  if 2 in selected:
    parts += ["## Table 2 — sampling cost and time to quality", sampling_table(runs, reported, threshold)]
    if "sao" in by_name and "gspo" in by_name:
      parts += ["## Figure 1 — costs relative to GSPO", cost_table(cost_ratios(by_name["sao"], by_name["gspo"],
                                                                              reported))]
  if 3 in selected:
    parts += [f"## Table 3 — behaviour: first and last {window} RL steps", behaviour_table(runs, window)]
  if 4 in selected:
    apps = [r for r in runs if r.name in APPLICATIONS]
    if apps:
      parts += ["## Table 4 — additional applications (validation %)", validation_table(apps, reported)]
    if "sao" in by_name and "sao_initial" in by_name:
      parts += ["## Table 4b — initial vs stabilized critic recipe",
                recipe_table(by_name, reported, ev_steps, turns_steps)]
    if tables is not None and len(parts) == 0:
      parts += ["## Table 4 — additional applications",
                f"(no runs named {' or '.join(APPLICATIONS)}, and not both sao and sao_initial)"]
  if 5 in selected:
    traced = [r for r in runs if r.traces]
    parts += ["## Table 5 — critic per-token inspection (pre-update values of sampled successes and failures)"]
    parts += [critic_table(r, reported) for r in traced] or [
        "(no run has critic traces: SAO runs write `critic_traces.jsonl` every `critic_trace_every` steps)"]
  return "\n\n".join(parts) + "\n"
