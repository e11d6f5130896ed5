"""The write-up's tables (Markdown), computed from run logs (`sao.analysis.runs`), beside its reported numbers.

`reported` is the write-up's data (`experiments/paper/reported.py`'s `ALL`), passed in because `sao.analysis`
does not import `experiments`. Steps are RL steps and validation is shown in percent (see `sao.analysis.runs`).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from sao.analysis import critic_diagnostics as diag
from sao.analysis import critic_traces as traces_lib
from sao.analysis.runs import (BEHAVIOUR_KEYS, EV_KEY, RunLog, cost_ratios, first_step_reaching, normalized_hours,
                               range_mean, selected_examples, trajectories_through, validation_summary, window_mean)


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
