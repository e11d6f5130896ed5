"""Tables and figures from real recorded toy runs (`tests/analysis/data/`, trimmed to the keys the analysis reads).

`sao_toy`: run H of docs/results.md (`sao_openswe.py:toy` as it was then: held-out targets, constant actor LR; 160 RL
steps after 10 value-pretraining steps, critic traces every 10 steps; one 128-episode base evaluation);
`gspo_toy`: `gspo_openswe.py:toy` from the `toy_sao_vs_gspo` sweep — the same toy settings and base model. These
are docs/results.md's numbers: a change to the analysis that moves them shows up here.
"""
from __future__ import annotations

import os

import pytest

from experiments.paper import reported
from sao.analysis import figures, runs, tables

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


@pytest.fixture(scope="module")
def sao():
  return runs.load_run("sao", os.path.join(DATA, "sao_toy"))


def test_recorded_sao_run_tables(sao):
  assert sao.step_offset == 10  # value pretraining
  v = runs.validation_summary(sao)
  assert (round(v.first, 1), round(v.best, 1), v.best_step, v.count) == (39.8, 69.5, 141, 14)
  text = tables.paper_tables([sao], reported.ALL, tables=[1, 3, 5])
  assert "| sao | 39.8 | 64.0 | 69.5 | 68.60 | 141 | 63.3 | — | 64.8 | — |" in text
  assert "| sao | 3.47 | 3.08 | 20.81 | 18.52 | 0.49 | 0.80 |" in text
  # 17 dumps × (success + failure), RL steps −10 (value pretraining) to 150.
  assert len(sao.traces) == 34 and {t.step for t in sao.traces} == set(range(-10, 151, 10))
  assert "| sao: 34 traces, 700 action tokens | this run | reported |" in text
  assert "| failure example (step 150) V first → last | 0.808 → 0.337 | 0.187 → 0.004 |" in text
  assert "| success mean > paired failure mean | 15 of 17 | 19 of 20 |" in text
  assert "| \\|ΔV\\| > 0.1 at message boundaries | 25.30 % of 83 | 1.86 % of 3,450 |" in text
  assert "| \\|ΔV\\| > 0.1 within turns | 8.92 % of 583 | 0.20 % of 955,928 |" in text
  assert "| boundary / within-turn jump rate | 2.8× | 9.2× |" in text


def test_recorded_runs_figures(sao, tmp_path):
  paths = figures.write_all([sao], reported.ALL, str(tmp_path))
  assert sorted(os.path.basename(p) for p in paths) == ["fig2_steps.png", "fig3_time.png", "fig5_diagnostics.png",
                                                        "fig7_critic_sao.png", "sao_curves.png"]
  for path in paths:
    assert os.path.getsize(path) > 10_000, path


def test_recorded_sao_vs_gspo(sao):
  gspo = runs.load_run("gspo", os.path.join(DATA, "gspo_toy"))
  text = tables.paper_tables([sao, gspo], reported.ALL, threshold=60.0, tables=[1, 2, 3])
  assert "| gspo | 49.2 | 64.0 | 61.7 | 70.40 | 151 | 61.7 | — | 58.4 | — |" in text
  assert "| sao | 141 | 9,088 | 12,800 | 91 | 5,888 | 7.3 |" in text
  assert "| gspo | 151 | 9,728 | 48,600 | 121 | 7,808 | 6.7 |" in text
  assert "6.6 % fewer (reported 73.7 %)" in text
  assert "| trajectories to best | 93.4 | 26.3 |" in text and "| rollouts per step | 100.0 | 12.5 |" in text
  assert "| gspo | 3.41 | 3.18 | 20.45 | 19.10 | 0.50 | 0.69 |" in text
