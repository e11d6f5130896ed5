"""A sweep's committed runs (`experiments/paper/runs/<sweep>/<run>/`, written by `sao.analysis.archive`) and the
per-run measures the sweep tables pool over seeds.

Measures (steps are RL steps, `sao.analysis.runs`; validation in %):
  base, last3, best   in-run validation: the base policy's (policy version 0), the mean of the last three trained
                      versions' evaluations (the trainer's own "after" number), the best trained one
  final/<split>       the final policy re-measured by `experiments/evaluate.py` (`evaluation/vN.json`), per split
  traj_to_thr         RL trajectories (trained + dropped) through the step whose evaluation first reached the
                      threshold (0 when the base policy already did; NaN when never)
  min_to_thr          wall minutes from the run's first logged step (value pretraining included) to that evaluation
  <key>_first/_last   mean of reward, response_length, turns over the first / last `window` RL steps (Table 3)
  ev                  critic explained variance, mean over the last `window` RL steps (SAO only)
  staleness           mean policy staleness of the trained batches over RL steps
  busy                trainer busy fraction: 1 − Σ `trainer/wait_s` / wall time of the RL steps (NaN when the log
                      has no wait times)
  step_s, wall_min    mean seconds per RL step; minutes from the first to the last logged step
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import numpy as np

from sao.analysis import archive
from sao.analysis import runs as runs_lib
from sao.analysis.curves import EVAL_RECORD_KEY

SPLITS = ("validation", "test", "train")


@dataclasses.dataclass
class SweepRun:
  """One committed run: its `run.json` fields, its log and its final re-measurement (None when not evaluated)."""
  info: dict[str, Any]
  log: runs_lib.RunLog
  evaluation: dict[str, dict] | None
  evaluated_policy: str | None

  @property
  def name(self) -> str:
    return self.info["name"]

  @property
  def arm(self) -> str:
    return self.info["arm"]

  @property
  def seed(self) -> int:
    return int(self.info["seed"])

  @property
  def version(self) -> str:
    return str(self.info.get("code_version") or "unknown")

  @property
  def complete(self) -> bool:
    return self.info["status"] == archive.COMPLETE


def load_sweep_runs(directory: str) -> list[SweepRun]:
  """Every run under `directory` (subdirectories with a `run.json`), sorted by name; FileNotFoundError when none."""
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"no sweep runs directory {directory!r}: no runs of this sweep are committed yet "
                            "(experiments/paper/trim.py writes them; docs/results.md has the commands)")
  out = []
  for name in sorted(os.listdir(directory)):
    run_dir = os.path.join(directory, name)
    path = os.path.join(run_dir, archive.RUN_FILE)
    if not os.path.isfile(path):
      continue
    with open(path, encoding="utf-8") as f:
      info = json.load(f)
    missing = [k for k in ("name", "arm", "seed", "status") if k not in info]
    if missing:
      raise ValueError(f"{path}: missing {missing}")
    found = runs_lib.final_evaluation(run_dir)
    out.append(SweepRun(info, runs_lib.load_run(info["name"], run_dir), found and found[1], found and found[0]))
  if not out:
    raise FileNotFoundError(f"{directory!r} holds no runs (<run>/{archive.RUN_FILE}); trim a sweep's runs into it "
                            "with experiments/paper/trim.py")
  return out


def by_version(runs: list[SweepRun]) -> dict[str, list[SweepRun]]:
  out: dict[str, list[SweepRun]] = {}
  for r in runs:
    out.setdefault(r.version, []).append(r)
  return out


def check_one_version(runs: list[SweepRun]) -> str:
  """The runs' shared code version; ValueError listing each version's runs when they differ."""
  groups = by_version(runs)
  if len(groups) > 1:
    listing = "; ".join(f"{v}: {sorted(r.name for r in rs)}" for v, rs in groups.items())
    raise ValueError(f"runs of different code versions cannot share one table ({listing}); rerun the odd runs at "
                     "one version, or print the tables per version (--by_version)")
  return next(iter(groups))


def evaluations(run: runs_lib.RunLog) -> list[tuple[int, float, float, float]]:
  """(RL step, policy version, success rate, record time) of each evaluation record, in log order."""
  out = []
  for r in run.records:
    if EVAL_RECORD_KEY in r and r.get("validation") is not None:
      out.append((r["step"] - run.step_offset, float(r.get("validation/policy_version", math.nan)),
                  float(r["validation"]), float(r.get("time", math.nan))))
  return out


def _first_time(run: runs_lib.RunLog) -> float:
  times = [float(r["time"]) for r in run.records if r.get("time") is not None]
  return min(times) if times else math.nan


def busy_fraction(run: runs_lib.RunLog) -> float:
  """1 − Σ wait / wall time over the RL steps that logged `archive.WAIT_KEY` (NaN when none did)."""
  steps, waits = run.series(archive.WAIT_KEY)
  keep = steps >= 0
  hours = runs_lib.normalized_hours(run)
  if not keep.any() or len(hours) < 2:
    return math.nan
  wall = 3600.0 * (hours[max(hours)] - hours[min(hours)])
  # The first RL step's wait precedes its record, the wall time starts at it: leave that wait out.
  waits = waits[keep][steps[keep] > min(hours)]
  return 1.0 - float(waits.sum()) / wall if wall > 0 else math.nan


def measures(run: SweepRun, threshold_pct: float, window: int = 20) -> dict[str, float]:
  """The module docstring's measures for one run."""
  log = run.log
  evals = evaluations(log)
  base = [v for _, ver, v, _ in evals if ver == 0]
  trained = [v for _, ver, v, _ in evals if ver > 0]
  out = {"base": 100.0 * base[0] if base else math.nan,
         "last3": 100.0 * float(np.mean(trained[-3:])) if trained else math.nan,
         "best": 100.0 * max(trained) if trained else math.nan}
  for split in SPLITS:
    result = (run.evaluation or {}).get(split)
    out[f"final/{split}"] = 100.0 * float(result["success_rate"]) if result else math.nan
  # The RL step of the first trained policy's evaluation below 5 % (where a run that broke down did so), or NaN.
  out["first_below_5"] = next((float(step) for step, ver, v, _ in evals if ver > 0 and 100.0 * v < 5.0), math.nan)
  hit = next(((step, t) for step, _, v, t in evals if 100.0 * v >= threshold_pct), None)
  if hit is None:
    out["traj_to_thr"], out["min_to_thr"] = math.nan, math.nan
  else:
    out["traj_to_thr"] = runs_lib.trajectories_through(log, hit[0]) if hit[0] >= 0 else 0.0
    out["min_to_thr"] = (hit[1] - _first_time(log)) / 60.0
  for key in runs_lib.BEHAVIOUR_KEYS:
    out[f"{key}_first"] = runs_lib.window_mean(log, key, window)
    out[f"{key}_last"] = runs_lib.window_mean(log, key, window, last=True)
  out["ev"] = runs_lib.window_mean(log, runs_lib.EV_KEY, window, last=True)
  out["staleness"] = runs_lib.range_mean(log, "staleness", 0, 1 << 30)
  out["busy"] = busy_fraction(log)
  out["step_s"] = runs_lib.step_seconds(log)
  times = [float(r["time"]) for r in log.records if r.get("time") is not None]
  out["wall_min"] = (max(times) - min(times)) / 60.0 if times else math.nan
  return out
