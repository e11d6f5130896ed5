"""Tables and figures from real recorded toy runs (`tests/analysis/data/`, trimmed to the keys the analysis reads).

`sao_toy`: `experiments/configs/sao_openswe.py:toy,learner.critic.frozen_params=` (160 RL steps after 10 value-
pretraining steps, critic traces every 10 steps); `gspo_toy`: `gspo_openswe.py:toy` from the
`toy_sao_vs_gspo` sweep. These are the README's numbers: a change to the analysis that moves them shows up here.
"""
from __future__ import annotations

import os

import pytest

from experiments.paper import reported
from sao.analysis import figures, tables

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


@pytest.fixture(scope="module")
def sao():
  return tables.load_run("sao", os.path.join(DATA, "sao_toy"))


def test_recorded_sao_run_tables(sao):
  assert sao.step_offset == 10  # value pretraining
  v = tables.validation_summary(sao)
  assert (round(v.first, 1), round(v.best, 1), v.best_step, v.count) == (48.4, 60.9, 141, 14)
  text = tables.paper_tables([sao], reported.ALL, tables=[1, 3, 5])
  assert "| sao | 48.4 | 64.0 | 60.9 | 68.60 | 141 | 53.9 | — | 55.6 | — |" in text
  assert "| sao | 3.53 | 3.20 | 21.21 | 19.23 | 0.45 | 0.74 |" in text
  # 17 dumps × (success + failure), RL steps −10 (value pretraining) to 150.
  assert len(sao.traces) == 34 and {t.step for t in sao.traces} == set(range(-10, 151, 10))
  assert "| sao: 34 traces, 741 action tokens | this run | reported |" in text
  assert "| success mean > paired failure mean | 11 of 17 | 19 of 20 |" in text
  assert "| \\|ΔV\\| > 0.1 at message boundaries | 30.00 % of 90 | 1.86 % of 3,450 |" in text
  assert "| \\|ΔV\\| > 0.1 within turns | 5.83 % of 617 | 0.20 % of 955,928 |" in text
  assert "| boundary / within-turn jump rate | 5.1× | 9.2× |" in text


def test_recorded_runs_figures(sao, tmp_path):
  paths = figures.write_all([sao], reported.ALL, str(tmp_path))
  assert sorted(os.path.basename(p) for p in paths) == ["fig2_steps.png", "fig3_time.png", "fig5_diagnostics.png",
                                                        "fig7_critic_sao.png", "sao_curves.png"]
  for path in paths:
    assert os.path.getsize(path) > 10_000, path


def test_recorded_sao_vs_gspo(sao):
  gspo = tables.load_run("gspo", os.path.join(DATA, "gspo_toy"))
  text = tables.paper_tables([sao, gspo], reported.ALL, threshold=50.0, tables=[1, 2])
  assert "| gspo | 37.5 | 64.0 | 47.7 | 70.40 | 111 | 45.3 | — | 44.1 | — |" in text
  assert "| sao | 141 | 9,088 | 12,800 | 81 | 5,248 | 7.8 |" in text
  assert "| gspo | 111 | 7,168 | 48,600 | — | — | — |" in text
  assert "| trajectories to best | 126.8 | 26.3 |" in text and "| rollouts per step | 100.0 | 12.5 |" in text
