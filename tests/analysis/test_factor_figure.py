"""The factors figure of `experiments/reproduce.py --sweep --out_dir` (`sao.analysis.arm_figures.plot_factors`):
written for a sweep whose `ANALYSIS` names a reference arm, one panel per other arm with that arm's and the reference
arm's mean curve and band; not written for a sweep without one."""
from __future__ import annotations

import os

import pytest

from experiments.paper import sweeps
from sao.analysis import arm_figures
from tests.analysis import sweep_fixtures as fx
from tests.analysis.test_sweep_tables import CONCURRENCY, CONCURRENCY_RUNS

TOY = "experiments/configs/sao_openswe.py:toy"
FACTORS = ('''ANALYSIS = {"kind": "ablations", "reference": "stabilized", '''
           '''"factors": {"no_whitening": "advantages not whitened", "warmup0": "critic warmup 0"}}''')
FACTOR_RUNS = f'''  seeds = s.product(s.sweep("seed", [0, 1]),
                    s.fixed(**{{"total_steps": 40, "recipe.value_pretrain_steps": 0}}))
  return (s.runs("stabilized", "{TOY}", seeds, name_keys=("seed",)) +
          s.runs("no_whitening", "{TOY}", s.product(seeds, s.fixed(**{{"learner.sao.whiten_advantages": False}})),
                 name_keys=("seed",)) +
          s.runs("warmup0", "{TOY}", s.product(seeds, s.fixed(**{{"learner.sao.critic_warmup_steps": 0}})),
                 name_keys=("seed",)))'''


def _outputs(tmp_path, monkeypatch, kind_block: str, runs_block: str, run_names: list[str]):
  """Writes synthetic runs, trims them, and calls `write_outputs`; returns (paths, the figures it saved)."""
  for i, name in enumerate(run_names):
    level = 0.5 + 0.02 * i
    fx.write_run(str(tmp_path / "work" / name), [0.4, 0.45, level, level + 0.01, level], monkeypatch=monkeypatch)
  sweep = fx.sweep_file(tmp_path, kind_block, runs_block)
  sweeps.trim_sweep(sweep, str(tmp_path / "work"), str(tmp_path / "runs"))
  text, groups = sweeps.sweep_report(sweep, str(tmp_path / "runs"))
  saved = []
  save = arm_figures._save  # pylint: disable=protected-access
  monkeypatch.setattr(arm_figures, "_save", lambda fig, path: saved.append(fig) or save(fig, path))
  return sweeps.write_outputs(sweep, text, groups, str(tmp_path / "out")), saved


def test_one_panel_per_arm_against_the_reference(tmp_path, monkeypatch):
  names = [f"{arm}-seed{seed}" for arm in ("stabilized", "no_whitening", "warmup0") for seed in (0, 1)]
  paths, saved = _outputs(tmp_path, monkeypatch, FACTORS, FACTOR_RUNS, names)
  assert [os.path.basename(p) for p in paths] == ["test_sweep.md", "test_sweep_arms.png", "test_sweep_factors.png"]
  assert os.path.getsize(paths[2]) > 10_000
  panels = saved[1].axes
  assert [ax.get_title() for ax in panels] == ["no_whitening: advantages not whitened", "warmup0: critic warmup 0"]
  for ax, arm in zip(panels, ("no_whitening", "warmup0")):
    assert [line.get_label() for line in ax.get_lines()] == ["stabilized (n=2)", f"{arm} (n=2)"]
    assert len(ax.collections) == 2  # both 95 % bands (two seeds each)

  runs = [r for group in sweeps.sweep_report(str(tmp_path / "test_sweep.py"), str(tmp_path / "runs"))[1].values()
          for r in group]
  with pytest.raises(ValueError, match="reference arm 'sao' has no complete run"):
    arm_figures.plot_factors(runs, "sao", str(tmp_path / "x.png"))
  with pytest.raises(ValueError, match="besides the reference arm 'warmup0'"):
    arm_figures.plot_factors([r for r in runs if r.arm == "warmup0"], "warmup0", str(tmp_path / "y.png"))


def test_no_factors_figure_without_a_reference_arm(tmp_path, monkeypatch):
  names = [f"{algorithm}-loops{loops}-seed{seed}" for loops in (16, 64) for algorithm in ("sao", "gspo")
           for seed in (0, 1)]
  paths, _ = _outputs(tmp_path, monkeypatch, CONCURRENCY, CONCURRENCY_RUNS, names)
  assert [os.path.basename(p) for p in paths] == ["test_sweep.md", "test_sweep_arms.png"]
  assert sorted(os.listdir(tmp_path / "out")) == ["test_sweep.md", "test_sweep_arms.png"]
