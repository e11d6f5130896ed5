r"""The README main job's speed: each run's RL step time beside what its steps trained, and the ratio of two trees'.

    python experiments/bench/job_speed.py --before=/tmp/job_before_0,/tmp/job_before_1 \
        --after=/tmp/job_after_0,/tmp/job_after_1

Per run (a workdir of `experiments/train.py`): the median and mean of the last 239 intervals between RL steps (the
job's 240 RL steps), the median response length (action tokens per trajectory) and trained tokens per update over
those steps, and validation (base policy → mean of the last 3 evaluations, best). Then the pooled medians' ratio,
before / after, over all runs and over the like runs: those whose response length is within `--like` (relative) of a
run's on the other side. The step time scales with the response length, which moves run to run (the same tree and seed
gave ≈ 20 and ≈ 54 tokens; docs/performance_job.md), so only runs of like lengths compare. The runs to compare
are the README command on each tree, back to back on the same idle machine (docs/performance_job.md has the loop).
"""
from __future__ import annotations

import os
import sys

import numpy as np
from absl import app, flags

# the repository, two folders up: this checkout's `sao`
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from sao.analysis import runs as runs_lib  # noqa: E402


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import: tests import every command in one process)."""
  global _BEFORE, _AFTER, _LIKE  # pylint: disable=global-statement
  _BEFORE = flags.DEFINE_list("before", [], "workdirs of the runs of the tree before")
  _AFTER = flags.DEFINE_list("after", [], "workdirs of the runs of the tree after")
  _LIKE = flags.DEFINE_float("like", 0.25, "a run within this relative distance of the response length of a run "
                             "on the other side is a like run")


def pooled_ratio(before: list[runs_lib.JobSpeed], after: list[runs_lib.JobSpeed]) -> float:
  """`median(before steps) / median(after steps)` over the runs' medians pooled (NaN if either side is empty)."""
  if not before or not after:
    return float("nan")
  return float(np.median([r.median_step_s for r in before]) / np.median([r.median_step_s for r in after]))


def like_runs(runs: list[runs_lib.JobSpeed], others: list[runs_lib.JobSpeed],
              within: float) -> list[runs_lib.JobSpeed]:
  """The `runs` whose response length is within `within` (relative) of the response length of one of `others`."""
  return [r for r in runs if any(abs(r.response_length - o.response_length) <= within * o.response_length
                                 for o in others)]


def _row(side: str, r: runs_lib.JobSpeed) -> str:
  return (f"| {side} | {r.name} | {r.median_step_s:.3f} / {r.mean_step_s:.3f} | {r.response_length:.1f} | "
          f"{r.trained_tokens:.0f} | {r.validation_base:.3f} → {r.validation_last3:.3f} ({r.validation_best:.3f}) |")


def main(argv) -> None:
  del argv
  if not _BEFORE.value and not _AFTER.value:
    raise app.UsageError("name runs with --before and/or --after")
  sides = {side: [runs_lib.job_speed(runs_lib.load_run(os.path.basename(os.path.normpath(w)), w)) for w in dirs]
           for side, dirs in (("before", _BEFORE.value), ("after", _AFTER.value))}
  print("| tree | run | RL step median / mean (s) | response length | trained tokens | validation base → last 3 "
        "(best) |")
  print("|---|---|---:|---:|---:|---|")
  for side, speeds in sides.items():
    for r in speeds:
      print(_row(side, r))
  before, after = sides["before"], sides["after"]
  if before and after:
    like = like_runs(before, after, _LIKE.value), like_runs(after, before, _LIKE.value)
    print(f"\npooled median step, before / after: {pooled_ratio(before, after):.2f}x over all runs "
          f"({len(before)} / {len(after)}); {pooled_ratio(*like):.2f}x over the like runs (response lengths within "
          f"{100 * _LIKE.value:.0f} % of one on the other side: {len(like[0])} / {len(like[1])})")


if __name__ == "__main__":
  define_flags()
  app.run(main)
