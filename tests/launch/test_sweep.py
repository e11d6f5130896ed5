"""Sweep helpers (product / zip_ / fixed / runs), sweep files, and override validation against real configs."""
from __future__ import annotations

import os

import pytest

from launch import sweep as s

SWEEPS = os.path.join(s.REPO_ROOT, "launch", "sweeps")


def test_product_zip_fixed():
  grid = s.product(s.sweep("a", [1, 2]), s.sweep("b", ["x", "y"]), s.fixed(c=0.5))
  assert grid == [{"a": 1, "b": "x", "c": 0.5}, {"a": 1, "b": "y", "c": 0.5},
                  {"a": 2, "b": "x", "c": 0.5}, {"a": 2, "b": "y", "c": 0.5}]
  assert s.zip_(s.sweep("a", [1, 2]), s.sweep("b", [3, 4])) == [{"a": 1, "b": 3}, {"a": 2, "b": 4}]
  with pytest.raises(ValueError, match="different lengths"):
    s.zip_(s.sweep("a", [1, 2]), s.sweep("b", [3]))
  with pytest.raises(ValueError, match="set twice"):
    s.product(s.fixed(a=1), s.fixed(a=2))


def test_runs_names_and_commands():
  runs = s.runs("sao", "experiments/configs/sao_openswe.py:toy",
                s.product(s.sweep("seed", [0, 1]), s.fixed(**{"rollout.batch_size": 8, "engine_urls": ("http://a",)})))
  assert [r.name for r in runs] == ["sao-seed0", "sao-seed1"]
  cmd = runs[1].command("/w/sao-seed1", python="python")
  assert cmd == ["python", "experiments/train.py", "--config=experiments/configs/sao_openswe.py:toy",
                 "--config.engine_urls=('http://a',)", "--config.rollout.batch_size=8", "--config.seed=1",
                 "--workdir=/w/sao-seed1"]
  with pytest.raises(ValueError, match="duplicate run names"):
    s.check_unique(runs + runs[:1])
  with pytest.raises(ValueError, match="directory name"):
    s.Run("a/b", "x.py:toy")


def test_validate_run_names_unknown_keys_and_bad_types():
  good = s.Run("ok", "experiments/configs/sao_openswe.py:toy", {"seed": 1, "learner.sao.dis_ratio_high": 5})
  s.validate_run(good)
  with pytest.raises(ValueError, match=r"run typo: unknown sweep key 'learner\.sao\.critic_epoch'"):
    s.validate_run(s.Run("typo", "experiments/configs/sao_openswe.py:toy", {"learner.sao.critic_epoch": 3}))
  with pytest.raises(ValueError, match="expects int"):
    s.validate_run(s.Run("t", "experiments/configs/sao_openswe.py:toy", {"seed": "one"}))
  with pytest.raises(FileNotFoundError, match="no_such.py"):
    s.validate_run(s.Run("t", "experiments/configs/no_such.py:toy", {}))


@pytest.mark.parametrize("sweep_file,prefixes", [("toy_sao_vs_gspo.py", ("sao", "gspo")),
                                                 ("toy_recipe_ablation.py", ("initial", "stabilized"))])
def test_shipped_sweeps(sweep_file, prefixes):
  runs = s.load_sweep(os.path.join(SWEEPS, sweep_file))
  assert len(runs) == 6 and {r.name.split("-")[0] for r in runs} == set(prefixes)
  for prefix in prefixes:
    assert sorted(r.overrides["seed"] for r in runs if r.name.startswith(prefix + "-")) == [0, 1, 2]
  for run in runs:
    assert run.config.endswith(":toy") and run.overrides["learner.seed"] == run.overrides["seed"]
    if os.path.isfile(os.path.join(s.REPO_ROOT, run.config_file)):
      s.validate_run(run)
    else:  # gspo_openswe.py is another engineer's file, written concurrently
      assert run.config_file == "experiments/configs/gspo_openswe.py"


def test_load_sweep_errors(tmp_path):
  with pytest.raises(FileNotFoundError):
    s.load_sweep(str(tmp_path / "missing.py"))
  (tmp_path / "empty.py").write_text("def get_sweep():\n  return []\n")
  with pytest.raises(ValueError, match="no runs"):
    s.load_sweep(str(tmp_path / "empty.py"))
