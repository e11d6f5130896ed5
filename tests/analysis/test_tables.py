"""Paper tables from synthetic run logs with known answers."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from experiments.paper import reported
from sao.analysis import runs, tables


def _write(workdir, records):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for r in records:
      f.write(json.dumps({"time": 0.0, **r}) + "\n")
  return str(workdir)


def _sao_log(tmp_path, name="sao"):
  """5 value-pretraining steps (logged 0..4), then RL steps 0..49 (logged 5..54); validation as in `VAL`."""
  records = [{"step": s, "phase/value_pretrain": 1.0, "batch/num_trajectories": 8.0, "dropped": 0.0, "turns": 99.0}
             for s in range(5)]
  for t in range(50):
    records.append({"step": 5 + t, "phase/rl": 1.0, "batch/num_trajectories": 8.0, "dropped": 1.0 if t == 3 else 0.0,
                    "turns": float(t), "response_length": 2.0 * t, "reward": 0.5,
                    "critic/explained_variance": 0.01 * t})
  for logged, value in [(2, 0.5), (15, 0.6), (25, 0.7), (35, 0.65), (45, 0.7), (54, 0.6)]:
    records.append({"step": logged, "validation": value, "validation/policy_version": 0})
  return runs.load_run(name, _write(tmp_path / name, records))


def _gspo_log(tmp_path):
  records = [{"step": s, "batch/num_trajectories": 32.0, "dropped": 0.0, "turns": 10.0, "reward": 0.25}
             for s in range(30)]
  records += [{"step": 0, "validation": 0.5}, {"step": 10, "validation": 0.8}]
  return runs.load_run("gspo", _write(tmp_path / "gspo", records))


def test_rl_steps_and_validation_summary(tmp_path):
  run = _sao_log(tmp_path)
  assert run.step_offset == 5
  v = runs.validation_summary(run)
  assert (v.first, v.best, v.best_step, v.final, v.count) == (50.0, 70.0, 20, 60.0, 6)
  assert v.last_five_mean == pytest.approx(np.mean([60, 70, 65, 70, 60]))
  # RL steps 0..20: 21 × 8 trained + 1 dropped; value-pretraining batches are not counted.
  assert runs.trajectories_through(run, v.best_step) == 21 * 8 + 1
  assert runs.first_step_reaching(run, 65.0) == 20
  assert runs.first_step_reaching(run, 55.0) == 10
  assert runs.first_step_reaching(run, 90.0) is None


def test_windows_and_ranges(tmp_path):
  run = _sao_log(tmp_path)
  assert runs.window_mean(run, "turns", 20) == pytest.approx(9.5)  # pretraining's 99s are excluded
  assert runs.window_mean(run, "turns", 20, last=True) == pytest.approx(39.5)
  assert runs.range_mean(run, runs.EV_KEY, 10, 20) == pytest.approx(0.15)
  assert np.isnan(runs.range_mean(run, runs.EV_KEY, 100, 200))


def test_paper_tables_side_by_side(tmp_path):
  sao, gspo = _sao_log(tmp_path), _gspo_log(tmp_path)
  initial = _sao_log(tmp_path, "sao_initial")
  text = tables.paper_tables([sao, gspo, initial], reported.ALL, threshold=65.0, ev_steps=(10, 20),
                             turns_steps=(0, 9))
  assert "| sao | 50.0 | 64.0 | 70.0 | 68.60 | 20 |" in text
  assert "| gspo | 50.0 | 64.0 | 80.0 | 70.40 | 10 |" in text
  assert "| sao | 20 | 169 | 12,800 | 20 | 169 |" in text
  assert "| gspo | 10 | 352 | 48,600 | 10 | 352 |" in text
  assert f"{100 * (1 - 169 / 352):.1f} % fewer (reported 73.7 %)" in text
  assert "| sao_initial | 0.150 | 0.034 | 70.0 | 66.4 | 4.5 | 109.5 |" in text
  assert "| sao | 0.150 | 0.272 | 70.0 | 68.6 | 4.5 | 49.1 |" in text
  assert "(no run has critic traces" in text  # Table 5 with traces: test_traces_and_figures.py


def test_table_selection(tmp_path):
  sao, gspo = _sao_log(tmp_path), _gspo_log(tmp_path)
  only_two = tables.paper_tables([sao, gspo], reported.ALL, threshold=65.0, tables=[2])
  assert "## Table 2" in only_two and "## Table 1" not in only_two and "## Table 3" not in only_two
  assert "| sao | 20 | 169 | 12,800 | 20 | 169 |" in only_two
  mixed = _sao_log(tmp_path, "sao_mixed_harness")
  four = tables.paper_tables([sao, mixed], reported.ALL, tables=[4])
  assert "## Table 4 — additional applications" in four and "| sao_mixed_harness |" in four and "| sao |" not in four
  with pytest.raises(ValueError, match="unknown table"):
    tables.paper_tables([sao], reported.ALL, tables=[7])


def test_applications_reported_columns(tmp_path):
  run = _sao_log(tmp_path, "sao_mixed_harness")
  text = tables.validation_table([run], reported.ALL)
  assert "| sao_mixed_harness | 50.0 | 51.0 | 70.0 | 61.67 | 20 | 60.0 | 57.00 | 65.0 | 57.6 |" in text


def test_errors_name_the_run(tmp_path):
  with pytest.raises(FileNotFoundError, match="run 'x'.*has no metrics.jsonl"):
    runs.load_run("x", str(tmp_path))
  _write(tmp_path / "empty", [])
  with pytest.raises(ValueError, match="run 'e'.*no metric records"):
    runs.load_run("e", str(tmp_path / "empty"))
  with pytest.raises(ValueError, match="duplicate"):
    run = _gspo_log(tmp_path)
    tables.paper_tables([run, run], reported.ALL)


def test_torn_last_line_is_ignored(tmp_path):
  workdir = _write(tmp_path / "torn", [{"step": 0, "validation": 0.25}])
  with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
    f.write('{"step": 1, "valid')
  assert runs.validation_summary(runs.load_run("torn", workdir)).best == 25.0


def test_reproduce_cli(tmp_path):
  import subprocess
  import sys
  _sao_log(tmp_path)
  _gspo_log(tmp_path)
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = tmp_path / "paper"
  result = subprocess.run([sys.executable, "experiments/reproduce.py",
                           f"--runs=sao={tmp_path / 'sao'},gspo={tmp_path / 'gspo'}", f"--out_dir={out}",
                           "--threshold=65"], cwd=repo, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  assert "## Table 2 — sampling cost" in result.stdout and "12,800" in result.stdout
  assert (out / "tables.md").is_file() and (out / "sao_curves.png").is_file() and (out / "gspo_curves.png").is_file()
  bad = subprocess.run([sys.executable, "experiments/reproduce.py", f"--runs=x={tmp_path / 'nothing'}"], cwd=repo,
                       capture_output=True, text=True, timeout=120)
  assert bad.returncode != 0 and "has no metrics.jsonl" in bad.stderr


def test_progress_rows_repeating_validation_are_not_evaluations(tmp_path):
  # Evaluations at steps 0, 10, 20 (with their record key); progress rows in between repeat the latest value.
  records = []
  for step, value in ((0, 0.2), (10, 0.6), (20, 0.4)):
    records.append({"step": step, "validation": value, runs.EVAL_RECORD_KEY: 64.0})
    records += [{"step": step + i, "validation": value, "reward": 0.5} for i in range(10)]
  v = runs.validation_summary(runs.load_run("r", _write(tmp_path / "r", records)))
  assert v.count == 3 and v.best == 60.0 and v.best_step == 10 and v.final == 40.0
  assert v.last_five_mean == pytest.approx(40.0)  # mean of the three evaluations, not the last value five times
