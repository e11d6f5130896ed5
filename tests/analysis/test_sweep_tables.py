"""`experiments/reproduce.py --sweep`: trim (`experiments/paper/trim.py`) + tables from synthetic runs in the trainer's
on-disk format (`tests/analysis/sweep_fixtures.py`) with hand-computed numbers: intervals, differences, incomplete
runs, code-version mixing."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from experiments.paper import sweeps

from sao.analysis import archive, sweep_runs
from sao.analysis import runs as runs_lib
from tests.analysis import sweep_fixtures as fx

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T975 = {2: 4.302652729749464}  # Student-t 0.975 quantile, df 2 (printed tables)

ALGORITHMS = '''ANALYSIS = {"kind": "algorithms", "arms": ("sao", "gspo"), "reference": "sao", "threshold_pct": 55.0}'''
ALGORITHM_RUNS = '''  grid = s.product(s.sweep("seed", [0, 1, 2, 3]), s.fixed(total_steps=40))
  pre = s.fixed(**{"recipe.value_pretrain_steps": 2})
  return (s.runs("sao", "experiments/configs/sao_openswe.py:toy", s.product(grid, pre), name_keys=("seed",)) +
          s.runs("gspo", "experiments/configs/gspo_openswe.py:toy", grid, name_keys=("seed",)))'''


@pytest.fixture
def algorithms_sweep(tmp_path, monkeypatch):
  """SAO seeds 0–2 (last-3 validation 60/62/64 %, re-measured), GSPO seeds 0–2 (50/53/56 %) and an incomplete GSPO
  seed 3 (cut at RL step 15 by an error); SAO seed 3 never started."""
  work = tmp_path / "work"
  for seed, level in enumerate((0.60, 0.62, 0.64)):
    fx.write_run(str(work / f"sao-seed{seed}"), [0.40, 0.50, level, level, level], pretrain=2,
                 evaluation={"validation": 0.55 + 0.05 * seed, "test": 0.5, "train": 0.7}, monkeypatch=monkeypatch)
  for seed, level in enumerate((0.50, 0.53, 0.56)):
    fx.write_run(str(work / f"gspo-seed{seed}"), [0.40, 0.45, level, level, level], ev=float("nan"),
                 monkeypatch=monkeypatch)
  fx.write_run(str(work / "gspo-seed3"), [0.40, 0.45], rl_steps=16, finished=False, monkeypatch=monkeypatch,
               log_tail="Traceback (most recent call last):\n  File x\nRuntimeError: boom\n")
  sweep = fx.sweep_file(tmp_path, ALGORITHMS, ALGORITHM_RUNS)
  return sweep, str(work), str(tmp_path / "committed")


def test_trim_keeps_what_the_tables_read(algorithms_sweep, capsys):
  sweep, work, out = algorithms_sweep
  metas = {m["name"]: m for m in sweeps.trim_sweep(sweep, work, out)}
  printed = capsys.readouterr().out
  assert "sao-seed3: not started" in printed and sorted(metas) == [
      "gspo-seed0", "gspo-seed1", "gspo-seed2", "gspo-seed3", "sao-seed0", "sao-seed1", "sao-seed2"]
  assert "gspo-seed0: complete" in printed and "re-measure it with: python experiments/evaluate.py" in printed
  assert metas["sao-seed1"]["status"] == "complete" and metas["sao-seed1"]["expected_last_step"] == 41
  bad = metas["gspo-seed3"]
  assert (bad["status"], bad["last_step"], bad["expected_last_step"], bad["note"]) == (
      "incomplete", 15, 39, "RuntimeError: boom")
  assert metas["sao-seed0"]["code_version"] == fx.VERSION and metas["sao-seed0"]["arm"] == "sao"
  with open(os.path.join(out, "sao-seed0", "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  assert all("actor/grad_norm" not in r and "hparams" not in r for r in records)
  assert {"validation", "validation/num_tasks", "phase/rl", "reward", "critic/explained_variance"} <= set().union(
      *records)
  assert sorted(os.listdir(os.path.join(out, "sao-seed0"))) == ["evaluation", "metrics.jsonl", "run.json"]
  assert os.listdir(os.path.join(out, "sao-seed0", "evaluation")) == ["v39.json"]
  # The tables' measures are the same from the trimmed log as from the trainer's.
  trimmed = {r.name: r for r in sweep_runs.load_sweep_runs(out)}
  for name in ("sao-seed1", "gspo-seed3"):
    raw = sweep_runs.SweepRun(trimmed[name].info, runs_lib.load_run(name, os.path.join(work, name)),
                              trimmed[name].evaluation, trimmed[name].evaluated_policy)
    expected, got = sweep_runs.measures(raw, 55.0), sweep_runs.measures(trimmed[name], 55.0)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
      assert got[key] == pytest.approx(value, rel=1e-5, nan_ok=True), (name, key)


def test_evaluation_locations(tmp_path):
  for version in (3, 12, 7):
    os.makedirs(tmp_path / "policy" / f"v{version}")
  os.makedirs(tmp_path / "policy" / "v99.tmp")
  assert runs_lib.final_policy_dir(str(tmp_path)) == str(tmp_path / "policy" / "v12")
  assert runs_lib.evaluation_path_for(str(tmp_path / "policy" / "v12")) == str(tmp_path / "evaluation" / "v12.json")
  assert runs_lib.evaluation_path_for(str(tmp_path / "base_model")) == str(tmp_path / "evaluation" /
                                                                           "base_model.json")
  assert runs_lib.evaluation_path_for(str(tmp_path / "elsewhere")) == ""
  with pytest.raises(FileNotFoundError, match="no exported policy"):
    runs_lib.final_policy_dir(str(tmp_path / "empty"))
  os.makedirs(tmp_path / "evaluation")
  for name, rate in (("v3", 0.1), ("v12", 0.5), ("base_model", 0.0)):
    (tmp_path / "evaluation" / f"{name}.json").write_text(json.dumps({"test": {"success_rate": rate}}))
  assert runs_lib.final_evaluation(str(tmp_path)) == ("v12", {"test": {"success_rate": 0.5}})


def test_algorithm_tables(algorithms_sweep):
  sweep, work, out = algorithms_sweep
  sweeps.trim_sweep(sweep, work, out)
  text, groups = sweeps.sweep_report(sweep, out)
  assert list(groups) == [fx.VERSION]
  assert "7 runs started: 6 complete, 1 incomplete" in text
  assert "Not started (or not committed) yet: 1 of the sweep's runs — sao-seed3." in text
  sao_half = T975[2] * 2.0 / 3 ** 0.5  # last-3: 60, 62, 64 → s = 2
  gspo_half = T975[2] * 3.0 / 3 ** 0.5  # 50, 53, 56 → s = 3
  # SAO: base 40, last-3 62 ± 4.97, best 62 ± 4.97, re-measured validation 60 ± t·5/√3, test 50, train 70; 21 RL steps
  # × 64 trajectories to the 55 % evaluation (RL step 20, logged step 22: 66 s after the first record); EV 0.25.
  val_half = T975[2] * 5.0 / 3 ** 0.5
  assert (f"| sao | 3/3 | 40.0 [40.0, 40.0] | 62.0 [{62 - sao_half:.1f}, {62 + sao_half:.1f}] | "
          f"62.0 [{62 - sao_half:.1f}, {62 + sao_half:.1f}] | 60.0 [{60 - val_half:.1f}, {60 + val_half:.1f}] | "
          "50.0 [50.0, 50.0] | 70.0 [70.0, 70.0] | 1,344 [1,344, 1,344] (3/3) | 1.1 [1.1, 1.1] (3/3) | "
          "0.250 [0.250, 0.250] |") in text
  # GSPO: the incomplete seed 3 is not in the statistics; only seed 2 reaches 55 % (RL step 20: 60 s).
  assert (f"| gspo | 3/4 | 40.0 [40.0, 40.0] | 53.0 [{53 - gspo_half:.1f}, {53 + gspo_half:.1f}] | "
          f"53.0 [{53 - gspo_half:.1f}, {53 + gspo_half:.1f}] | — | — | — | 1,344 (n=1) (1/3) | 1.0 (n=1) (1/3) | — |"
          ) in text
  # Paired by seed: 60−50, 62−53, 64−56 = 10, 9, 8 → 9 ± t·1/√3.
  half = T975[2] / 3 ** 0.5
  assert f"| in-run validation, last-3 mean (points) | +9.0 [{9 - half:.1f}, {9 + half:.1f}] (paired t, n=3) |" in text
  # Reward over the first 20 RL steps: 0.202 + 0.01·(0..19) → 0.297; last 20: 0.202 + 0.01·(20..39) → 0.497.
  assert "| sao | 0.30 [0.30, 0.30] | 0.50 [0.50, 0.50] | 19.05 [19.05, 19.05] | 17.05 [17.05, 17.05] |" in text
  assert "| RL trajectories to ≥ 55 % | +0 (n=1) |" in text  # GSPO reached it in one seed: no interval
  assert "| gspo-seed3 | gspo | 3 | incomplete | 15 / 39 | 40.0 → 45.0 | — | RuntimeError: boom |" in text
  assert "| sao-seed0 | sao | 0 | complete | 41 / 41 | 40.0 → 60.0 | v39 |" in text


def test_mixed_code_versions_are_refused_or_grouped(algorithms_sweep):
  sweep, work, out = algorithms_sweep
  sweeps.trim_sweep(sweep, work, out)
  path = os.path.join(out, "gspo-seed1", archive.RUN_FILE)
  with open(path) as f:
    info = json.load(f)
  info["code_version"] = "b" * 40
  with open(path, "w") as f:
    json.dump(info, f)
  with pytest.raises(ValueError, match=r"different code versions.*bbbb.*gspo-seed1"):
    sweeps.sweep_report(sweep, out)
  text, groups = sweeps.sweep_report(sweep, out, by_version=True)
  assert sorted(groups) == ["a" * 40, "b" * 40] and text.startswith("# 2 code versions")
  assert f"## Sweep `test_sweep` — code version {'b' * 40}" in text and "1 runs started: 1 complete" in text


CONCURRENCY = ('''ANALYSIS = {"kind": "concurrency", "algorithms": ("sao", "gspo"), "loops": (16, 64), '''
               '''"threshold_pct": 55.0}''')
CONCURRENCY_RUNS = '''  out = []
  for loops in (16, 64):
    grid = s.product(s.sweep("seed", [0, 1]), s.fixed(**{"total_steps": 40, "rollout.concurrency": loops}))
    out += s.runs(f"sao-loops{loops}", "experiments/configs/sao_openswe.py:toy",
                  s.product(grid, s.fixed(**{"recipe.value_pretrain_steps": 0})), name_keys=("seed",))
    out += s.runs(f"gspo-loops{loops}", "experiments/configs/gspo_openswe.py:toy", grid, name_keys=("seed",))
  return out'''


def test_concurrency_tables(tmp_path, monkeypatch):
  work = tmp_path / "work"
  for loops, step_s in ((16, 4.0), (64, 2.0)):
    for algorithm in ("sao", "gspo"):
      for seed in (0, 1):
        fx.write_run(str(work / f"{algorithm}-loops{loops}-seed{seed}"), [0.4, 0.5, 0.6, 0.6, 0.6], step_s=step_s,
                     wait_s=step_s / 4 if algorithm == "sao" else None, monkeypatch=monkeypatch)
  sweep = fx.sweep_file(tmp_path, CONCURRENCY, CONCURRENCY_RUNS)
  sweeps.trim_sweep(sweep, str(work), str(tmp_path / "c"))
  text, _ = sweeps.sweep_report(sweep, str(tmp_path / "c"))
  # 16 loops: 4 s per step, the 55 % evaluation at RL step 20 (80 s); waits of 1 s per 4 s step → busy 0.75.
  assert ("| sao-loops16 | 2/2 | 1.3 [1.3, 1.3] (2/2) | 0.750 [0.750, 0.750] | 1.00 [1.00, 1.00] | "
          "4.00 [4.00, 4.00] | 2.6 [2.6, 2.6] | 60.0 [60.0, 60.0] |") in text
  assert "| gspo-loops64 | 2/2 | 0.7 [0.7, 0.7] (2/2) | — |" in text
  assert "no `trainer/wait_s`" in text
  assert "linear scaling: 4×" in text and "| sao | seconds per RL step | 2.00 [2.00, 2.00] (n=2) |" in text


ABLATIONS = ('''ANALYSIS = {"kind": "ablations", "reference": "stabilized", '''
             '''"factors": {"no_whitening": "advantages not whitened"}}''')
ABLATION_RUNS = '''  seeds = s.product(s.sweep("seed", [0, 1, 2]),
                    s.fixed(**{"total_steps": 40, "recipe.value_pretrain_steps": 0}))
  return (s.runs("stabilized", "experiments/configs/sao_openswe.py:toy", seeds, name_keys=("seed",)) +
          s.runs("no_whitening", "experiments/configs/sao_openswe.py:toy",
                 s.product(seeds, s.fixed(**{"learner.sao.whiten_advantages": False})), name_keys=("seed",)))'''


def _ablation_runs(work, finals, monkeypatch) -> None:
  """stabilized / no_whitening runs of seeds 0.. whose last three validations are the given (ref, ablated) pairs."""
  for seed, (ref, ablated) in enumerate(finals):
    fx.write_run(str(work / f"stabilized-seed{seed}"), [0.4, 0.5, ref, ref, ref], monkeypatch=monkeypatch)
    fx.write_run(str(work / f"no_whitening-seed{seed}"), [0.4, 0.45, ablated, ablated, ablated],
                 monkeypatch=monkeypatch)


def test_ablation_tables(tmp_path, monkeypatch):
  work = tmp_path / "work"
  _ablation_runs(work, ((0.60, 0.50), (0.64, 0.60), (0.62, 0.49)), monkeypatch)
  sweep = fx.sweep_file(tmp_path, ABLATIONS, ABLATION_RUNS)
  sweeps.trim_sweep(sweep, str(work), str(tmp_path / "a"))
  text, _ = sweeps.sweep_report(sweep, str(tmp_path / "a"))
  # Per-seed differences −10, −4, −13: mean −9, s = √21.
  half = T975[2] * 21 ** 0.5 / 3 ** 0.5
  assert (f"| no_whitening | advantages not whitened | 3/3 | 53.0 [" in text and
          f"| -9.0 [{-9 - half:.1f}, {-9 + half:.1f}] (paired t, n=3) | — |" in text)
  assert "| stabilized | the stabilized recipe | 3/3 | 62.0 [57.0, 67.0] | — | — | — |" in text


def test_reproduce_cli_sweep(algorithms_sweep):
  sweep, work, out = algorithms_sweep
  sweeps.trim_sweep(sweep, work, out)
  figures = os.path.join(os.path.dirname(out), "figures")
  result = subprocess.run([sys.executable, "experiments/reproduce.py", f"--sweep={sweep}", f"--runs_dir={out}",
                           f"--out_dir={figures}"], cwd=REPO, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  assert "## Sweep `test_sweep`" in result.stdout and "### Differences: sao − each other arm" in result.stdout
  assert os.path.getsize(os.path.join(figures, "test_sweep_arms.png")) > 10_000
  both = subprocess.run([sys.executable, "experiments/reproduce.py", f"--sweep={sweep}", "--runs=a=/x"], cwd=REPO,
                        capture_output=True, text=True, timeout=120)
  assert both.returncode != 0 and "exactly one of --runs" in both.stderr


def test_no_runs_is_an_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="holds no runs"):
    sweep_runs.load_sweep_runs(str(tmp_path))


def test_trim_re_measures_finished_runs_first(algorithms_sweep, capsys):
  sweep, work, out = algorithms_sweep
  fake = ("import json, os, sys; d = sys.argv[1]; assert not d.endswith('seed1'), 'engine died'; "
          "os.makedirs(os.path.join(d, 'evaluation')); "
          "json.dump({'test': {'success_rate': 0.25}}, open(os.path.join(d, 'evaluation', 'v39.json'), 'w'))")
  asked = []

  def command(run, run_dir):
    asked.append(run.name)
    return [sys.executable, "-c", fake, run_dir]

  metas = sweeps.trim_sweep(sweep, work, out, evaluate_command=command)
  # SAO runs already have one; the incomplete gspo-seed3 is not re-measured.
  assert asked == ["gspo-seed0", "gspo-seed1", "gspo-seed2"]
  printed = capsys.readouterr().out
  assert "gspo-seed1: re-measurement failed (exit code 1)" in printed and "engine died" in printed
  runs = {r.name: r for r in sweep_runs.load_sweep_runs(out)}
  assert runs["gspo-seed0"].evaluation == {"test": {"success_rate": 0.25}} and runs["gspo-seed1"].evaluation is None
  assert len(metas) == 7


def test_a_resumed_run_keeps_its_last_attempt():
  steps = [0, 1, 2, 3, 4, 2, 3, 4, 5, 3, 4, 5, 6]  # checkpoints at 2, then at 3
  records = [{"step": st, "attempt": i} for i, st in enumerate(steps)]
  kept, restarts = archive.drop_abandoned(records)
  assert restarts == 2 and [r["step"] for r in kept] == [0, 1, 2, 3, 4, 5, 6]
  assert [r["attempt"] for r in kept] == [0, 1, 5, 9, 10, 11, 12]


def test_ablation_tables_against_a_second_base(tmp_path, monkeypatch):
  """`also_against`: arms against another arm than the reference too, paired by seed, with the breakdowns counted."""
  work = tmp_path / "work"
  _ablation_runs(work, ((0.60, 0.02), (0.64, 0.60), (0.62, 0.49)), monkeypatch)
  analysis = ABLATIONS[:-1] + ', "also_against": {"no_whitening": ("stabilized",)}}'
  sweep = fx.sweep_file(tmp_path, analysis, ABLATION_RUNS)
  sweeps.trim_sweep(sweep, str(work), str(tmp_path / "a"))
  text, _ = sweeps.sweep_report(sweep, str(tmp_path / "a"))
  # stabilized − no_whitening per seed: +58, +4, +13: mean 25.0; one no_whitening run at 2 %.
  assert "### Against `no_whitening` (final validation %)" in text
  assert "| no_whitening | 3/3 | 37.0 [" in text and "| — | — | 1/3 |" in text
  assert "| stabilized | 3/3 | 62.0 [57.0, 67.0] | +25.0 [" in text and "(paired t, n=3) | — | 0/3 |" in text
