"""`sao.analysis.runs.job_speed` and `experiments/bench/job_speed.py` on synthetic metric logs: the step intervals, the
response length and trained tokens of the measured steps, validation, and ratios over all and over like runs."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from experiments.bench import job_speed
from sao.analysis import runs as runs_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _write_run(workdir, step_s: float, length: float, grouped: bool = True, rl_steps: int = 50):
  """A trainer-shaped log: 5 value-pretraining steps, then `rl_steps` RL steps `step_s` apart (the first RL step 10 s
  after the last pretraining one), evaluations at RL steps 0, 20 and 40."""
  os.makedirs(workdir, exist_ok=True)
  rows, t = [], 1000.0
  for step in range(5):
    t += 3.0
    rows.append({"step": step, "time": t, "reward": 0.1, "response_length": 99.0})
  t += 10.0
  for i in range(rl_steps):
    step = 5 + i
    if i % 20 == 0:
      rows.append({"step": step, "time": t, "validation": 0.4 + 0.01 * i, "validation/policy_version": i,
                   "phase/rl": 1.0})
    row = {"step": step, "time": t, "reward": 0.5, "response_length": length, "phase/rl": 1.0}
    row.update({"batch/grouped_padded_tokens": 6000.0} if grouped else
               {"batch/padded_rows": 64.0, "batch/padded_length": 160.0})
    rows.append(row)
    t += step_s * (3.0 if i == 1 else 1.0)  # one slow step: the mean moves, the median does not
  with open(os.path.join(workdir, "metrics.jsonl"), "w", encoding="utf-8") as f:
    f.write("\n".join(json.dumps(r) for r in rows) + "\n")
  return str(workdir)


def test_job_speed_reads_the_rl_steps_only(tmp_path):
  speed = runs_lib.job_speed(runs_lib.load_run("a", _write_run(tmp_path / "a", 0.5, 20.0)))
  assert speed.steps == 49 and speed.median_step_s == pytest.approx(0.5)
  assert speed.mean_step_s == pytest.approx((48 * 0.5 + 1.5) / 49)
  assert (speed.response_length, speed.trained_tokens) == (20.0, 6000.0)
  assert (speed.validation_base, speed.validation_best) == (pytest.approx(0.4), pytest.approx(0.8))
  assert speed.validation_last3 == pytest.approx(np.mean([0.4, 0.6, 0.8]))
  last = runs_lib.job_speed(runs_lib.load_run("a", str(tmp_path / "a")), last=10)
  assert last.steps == 10 and last.mean_step_s == pytest.approx(0.5)  # the slow step is before the last 10
  padded = runs_lib.job_speed(runs_lib.load_run("b", _write_run(tmp_path / "b", 1.0, 21.0, grouped=False)))
  assert padded.trained_tokens == 64 * 160  # a log without length groups: the padded batch


def test_job_speed_refuses_a_log_without_rl_steps(tmp_path):
  _write_run(tmp_path / "c", 0.5, 20.0, rl_steps=1)
  with pytest.raises(ValueError, match="fewer than two RL steps"):
    runs_lib.job_speed(runs_lib.load_run("c", str(tmp_path / "c")))


def test_ratios_over_all_and_like_runs(tmp_path):
  speed = lambda name, s, length: runs_lib.job_speed(runs_lib.load_run(name, _write_run(tmp_path / name, s, length)))
  before = [speed("b0", 1.0, 20.0), speed("b1", 1.2, 21.0)]
  after = [speed("a0", 0.3, 20.5), speed("a1", 0.6, 54.0)]
  assert job_speed.pooled_ratio(before, after) == pytest.approx(1.1 / 0.45)
  assert [r.name for r in job_speed.like_runs(after, before, 0.25)] == ["a0"]
  assert job_speed.pooled_ratio(job_speed.like_runs(before, after, 0.25),
                                job_speed.like_runs(after, before, 0.25)) == pytest.approx(1.1 / 0.3)
  assert np.isnan(job_speed.pooled_ratio([], after))


def test_the_command_prints_a_row_per_run_and_the_ratios(tmp_path):
  dirs = [_write_run(tmp_path / n, s, length) for n, s, length in (("b0", 1.0, 20.0), ("a0", 0.25, 20.0))]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
  out = subprocess.run([sys.executable, str(ROOT / "experiments" / "bench" / "job_speed.py"), f"--before={dirs[0]}",
                        f"--after={dirs[1]}"], env=env, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "| before | b0 | 1.000 / 1.041 | 20.0 | 6000 |" in out.stdout
  assert "4.00x over all runs (1 / 1); 4.00x over the like runs" in out.stdout
