"""The issue-21 sweep tables (markdown) from committed runs (`sao.analysis.sweep_runs`), per the sweep file's
`ANALYSIS` dict (`launch/sweeps/<name>.py`):

  kind "algorithms"   per arm: in-run validation, the re-measured final policy per split, trajectories and wall
                      time to the shared threshold, critic EV; Table 3's behaviour windows; reference − each other
                      arm with intervals
  kind "concurrency"  per algorithm × agent loops: wall time to the threshold, trainer busy fraction, staleness,
                      seconds per RL step; the speed-up from the fewest to the most loops against linear scaling
  kind "ablations"    per factor: final validation and its difference from the reference arm with intervals, and
                      what the factor costs or saves in time (seconds per RL step, mean staleness)

Cells are `mean [95 % interval]` over an arm's complete runs (`sao.analysis.stats`: t-interval on seeds;
differences paired by seed, Welch when seed sets differ). Every started run is accounted for: the runs table at the
end lists each run with its status; incomplete runs (cut short, failed) are not in the statistics and say why.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from sao.analysis import stats
from sao.analysis.sweep_runs import SPLITS, SweepRun, measures
from sao.analysis.tables import fmt, markdown_table

METHOD = ("Cells: mean [95 % interval] over an arm's complete runs — Student-t interval on seeds; differences "
          "paired by seed (Welch's interval when the seed sets differ); `(n=1)`: one run, no interval; `—`: no value.")


def _arm_values(arm_runs: Sequence[SweepRun], key: str, m: Mapping[str, dict]) -> dict[int, float]:
  return {r.seed: m[r.name][key] for r in arm_runs if r.complete}


def _cell(arm_runs, key, m, digits=1) -> str:
  return stats.format_interval(stats.mean_interval(list(_arm_values(arm_runs, key, m).values())), digits)


def _reached(arm_runs, key, m, digits=1) -> str:
  """A time-to-threshold cell: the interval over the seeds that reached it, and how many did."""
  values = _arm_values(arm_runs, key, m)
  k = sum(1 for v in values.values() if math.isfinite(v))
  return f"{stats.format_interval(stats.mean_interval(list(values.values())), digits)} ({k}/{len(values)})"


def _group(runs: Sequence[SweepRun], order: Sequence[str] = ()) -> dict[str, list[SweepRun]]:
  arms: dict[str, list[SweepRun]] = {a: [] for a in order}
  for r in runs:
    arms.setdefault(r.arm, []).append(r)
  return {a: sorted(rs, key=lambda r: r.seed) for a, rs in arms.items()}


def _count(arm_runs: Sequence[SweepRun]) -> str:
  return f"{sum(r.complete for r in arm_runs)}/{len(arm_runs)}"


def runs_table(runs: Sequence[SweepRun], m: Mapping[str, dict]) -> str:
  """Every started run: status, last step of the expected, in-run validation, note."""
  rows = []
  for r in sorted(runs, key=lambda r: (r.arm, r.seed)):
    mm = m[r.name]
    rows.append([r.name, r.arm, str(r.seed), r.info["status"],
                 f"{r.info.get('last_step', '—')} / {r.info.get('expected_last_step', '—')}",
                 f"{fmt(mm['base'])} → {fmt(mm['last3'])}", r.evaluated_policy or "—",
                 str(r.info.get("note") or "").replace("|", "\\|")])
  return markdown_table(["run", "arm", "seed", "status", "last step / expected", "validation % base → last-3",
                         "re-measured", "note"], rows)


def _difference_cell(iv: stats.Interval, digits: int) -> str:
  if not iv.n:
    return "—"
  text = stats.format_interval(iv, digits, signed=True)
  return f"{text} ({iv.method}, n={iv.n})" if math.isfinite(iv.low) else text


def _difference_rows(arms: Mapping[str, list[SweepRun]], reference: str, m, keys: Sequence[tuple[str, str, int]]
                     ) -> tuple[list[str], list[list[str]]]:
  others = [a for a in arms if a != reference]
  header = ["measure"] + [f"{reference} − {a}" for a in others]
  rows = []
  for key, label, digits in keys:
    row = [label]
    for other in others:
      iv = stats.difference_interval(_arm_values(arms[reference], key, m), _arm_values(arms[other], key, m))
      row.append(_difference_cell(iv, digits))
    rows.append(row)
  return header, rows


def algorithms_tables(runs: Sequence[SweepRun], analysis: Mapping[str, Any], m: Mapping[str, dict],
                      window: int) -> list[str]:
  thr = analysis["threshold_pct"]
  arms = _group(runs, analysis.get("arms", ()))
  rows = []
  for arm, rs in arms.items():
    rows.append([arm, _count(rs), _cell(rs, "base", m), _cell(rs, "last3", m), _cell(rs, "best", m),
                 *[_cell(rs, f"final/{s}", m) for s in SPLITS], _reached(rs, "traj_to_thr", m, 0),
                 _reached(rs, "min_to_thr", m), _cell(rs, "ev", m, 3)])
  header = ["arm", "complete/started", "validation % base", "last-3 mean", "best",
            *[f"re-measured {s} %" for s in SPLITS], f"RL trajectories to ≥ {thr:g} % (reached)",
            f"minutes to ≥ {thr:g} % (reached)", f"critic EV last {window}"]
  parts = [f"### Per arm (threshold {thr:g} %; minutes from the run's first logged step, value pretraining "
           "included; trajectories over RL steps)", markdown_table(header, rows)]
  behaviour_header, behaviour_rows = ["arm"], []
  for key in ("reward", "response_length", "turns"):
    behaviour_header += [f"{key} first {window}", f"{key} last {window}"]
  for arm, rs in arms.items():
    behaviour_rows.append([arm] + [_cell(rs, f"{key}_{end}", m, 2) for key in ("reward", "response_length", "turns")
                                   for end in ("first", "last")])
  parts += [f"### Behaviour: first and last {window} RL steps (the write-up's Table 3)",
            markdown_table(behaviour_header, behaviour_rows)]
  reference = analysis.get("reference")
  if reference in arms and len(arms) > 1:
    keys = [("last3", "in-run validation, last-3 mean (points)", 1), ("best", "in-run best validation (points)", 1),
            *[(f"final/{s}", f"re-measured {s} (points)", 1) for s in SPLITS],
            ("traj_to_thr", f"RL trajectories to ≥ {thr:g} %", 0), ("min_to_thr", f"minutes to ≥ {thr:g} %", 1)]
    header, diff_rows = _difference_rows(arms, reference, m, keys)
    parts += [f"### Differences: {reference} − each other arm", markdown_table(header, diff_rows)]
  return parts


def concurrency_tables(runs: Sequence[SweepRun], analysis: Mapping[str, Any], m: Mapping[str, dict],
                       window: int) -> list[str]:
  del window  # no windowed measure here
  thr, loops, algorithms = analysis["threshold_pct"], tuple(analysis["loops"]), tuple(analysis["algorithms"])
  arms = _group(runs, [f"{a}-loops{n}" for n in loops for a in algorithms])
  rows = []
  for arm, rs in arms.items():
    rows.append([arm, _count(rs), _reached(rs, "min_to_thr", m), _cell(rs, "busy", m, 3), _cell(rs, "staleness", m, 2),
                 _cell(rs, "step_s", m, 2), _cell(rs, "wall_min", m), _cell(rs, "last3", m)])
  parts = [f"### Matched concurrency (one worker × loops agent loops, one engine batching every loop; threshold "
           f"{thr:g} %)", markdown_table(
               ["arm", "complete/started", f"minutes to ≥ {thr:g} % (reached)", "trainer busy fraction",
                "staleness", "seconds per RL step", "wall minutes", "validation % last-3"], rows)]
  if any(all(math.isnan(m[r.name]["busy"]) for r in rs) for rs in arms.values() if rs):
    parts.append("Trainer busy fraction: `—` where the logs hold no `trainer/wait_s` (seconds the trainer waited "
                 "for each step's batch).")
  lo, hi = min(loops), max(loops)
  scale_rows = []
  for a in algorithms:
    slow, fast = arms.get(f"{a}-loops{lo}", []), arms.get(f"{a}-loops{hi}", [])
    for key, label in (("step_s", "seconds per RL step"), ("min_to_thr", f"minutes to ≥ {thr:g} %")):
      iv = stats.ratio_interval(_arm_values(slow, key, m), _arm_values(fast, key, m))
      scale_rows.append([a, label, stats.format_interval(iv, 2) + (f" (n={iv.n})" if iv.n > 1 else "")])
  parts += [f"### Speed-up from {lo} to {hi} loops ({lo}-loop / {hi}-loop, per seed; linear scaling: {hi / lo:g}×)",
            markdown_table(["algorithm", "measure", "ratio"], scale_rows)]
  return parts


def ablation_tables(runs: Sequence[SweepRun], analysis: Mapping[str, Any], m: Mapping[str, dict],
                    window: int) -> list[str]:
  reference, factors = analysis["reference"], dict(analysis["factors"])
  arms = _group(runs, [reference, *factors])
  rows = []
  for arm, rs in arms.items():
    row = [arm, factors.get(arm, "the stabilized recipe" if arm == reference else "?"), _count(rs),
           _cell(rs, "last3", m), _cell(rs, "final/validation", m)]
    for key in ("last3", "final/validation"):
      if arm == reference:
        row.append("—")
        continue
      iv = stats.difference_interval(_arm_values(rs, key, m), _arm_values(arms.get(reference, []), key, m))
      row.append(_difference_cell(iv, 1))
    rows.append(row + [_cell(rs, "best", m), _cell(rs, "ev", m, 3), _cell(rs, "step_s", m, 2),
                       _cell(rs, "staleness", m, 2)])
  parts = [f"### One-factor ablations vs `{reference}` (final validation %)", markdown_table(
      ["arm", "change", "complete/started", "in-run last-3 mean", "re-measured validation",
       f"Δ last-3 vs {reference}", f"Δ re-measured vs {reference}", "in-run best", f"critic EV last {window}",
       "s per RL step", "staleness"], rows)]
  # `also_against = {base arm: (arms, …)}`: those arms against a second base as well (e.g. each correction under a
  # stress setting against the stress setting alone), with how many runs broke down (last-3 below 5 %).
  for base, others in dict(analysis.get("also_against", {})).items():
    base_runs = arms.get(base, [])
    rows = []
    for arm in (base, *others):
      rs = arms.get(arm, [])
      cells = ["—" if arm == base else _difference_cell(stats.difference_interval(
          _arm_values(rs, key, m), _arm_values(base_runs, key, m)), 1) for key in ("last3", "final/validation")]
      broken = [r for r in rs if r.complete and m[r.name]["last3"] < 5.0]
      steps = ", ".join(f"{m[r.name]['first_below_5']:.0f}" for r in broken) or "—"
      rows.append([arm, _count(rs), _cell(rs, "last3", m), *cells, f"{len(broken)}/{sum(r.complete for r in rs)}",
                   steps])
    parts += [f"### Against `{base}` (final validation %)", markdown_table(
        ["arm", "complete/started", "in-run last-3 mean", f"Δ last-3 vs {base}", f"Δ re-measured vs {base}",
         "broke down (last-3 < 5 %)", "RL step of its first evaluation < 5 %"], rows)]
  return parts


KINDS: dict[str, Callable[..., list[str]]] = {"algorithms": algorithms_tables, "concurrency": concurrency_tables,
                                              "ablations": ablation_tables}


def sweep_tables(name: str, runs: Sequence[SweepRun], analysis: Mapping[str, Any], version: str,
                 threshold_pct: float | None = None, window: int = 20, not_started: Sequence[str] = ()) -> str:
  """The markdown document for one sweep (one code version's runs); `not_started`: the sweep's runs with no
  committed directory yet."""
  kind = analysis["kind"]
  if kind not in KINDS:
    raise ValueError(f"sweep {name}: unknown ANALYSIS kind {kind!r}; expected one of {sorted(KINDS)}")
  analysis = dict(analysis)
  if threshold_pct is not None:
    analysis["threshold_pct"] = threshold_pct
  m = {r.name: measures(r, analysis.get("threshold_pct", math.inf), window) for r in runs}
  complete = sum(r.complete for r in runs)
  parts = [f"## Sweep `{name}` — code version {version}",
           f"{len(runs)} runs started: {complete} complete, {len(runs) - complete} incomplete (not in the statistics; "
           "listed below). " + METHOD]
  if not_started:
    parts.append(f"Not started (or not committed) yet: {len(not_started)} of the sweep's runs — "
                 f"{', '.join(not_started)}.")
  parts += KINDS[kind](runs, analysis, m, window)
  parts += ["### Every started run", runs_table(runs, m)]
  return "\n\n".join(parts) + "\n"
