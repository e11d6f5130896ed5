"""Tables and figures from real recorded toy runs (`tests/analysis/data/`, trimmed to the keys the analysis reads).

Both are seed 0 of `launch/sweeps/toy_algorithms.py` (code version e4f743b, 2026-11-30): `sao_toy` is
`sao_openswe.py:toy` (held-out ranges, cosine actor LR; 240 RL steps after 10 value-pretraining steps, critic traces
every 10 steps), `gspo_toy` is `gspo_openswe.py:toy` on the same base policy and budget. Written from the run
directories with `sao.analysis.archive.write_recorded_run(<run dir>, tests/analysis/data/<name>)`. These are
docs/results.md's numbers: a change to the analysis that moves them shows up here.
"""
from __future__ import annotations

import json
import os

import pytest

from experiments.paper import reported
from sao.analysis import archive, figures, runs, tables

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


@pytest.fixture(scope="module")
def sao():
  return runs.load_run("sao", os.path.join(DATA, "sao_toy"))


def test_recorded_sao_run_tables(sao):
  assert sao.step_offset == 10  # value pretraining
  v = runs.validation_summary(sao)
  assert (round(v.first, 1), round(v.best, 1), v.best_step, v.count) == (46.3, 84.4, 142, 22)
  text = tables.paper_tables([sao], reported.ALL, tables=[1, 3, 5])
  assert "| sao | 46.3 | 64.0 | 84.4 | 68.60 | 142 | 82.0 | — | 80.0 | — |" in text
  assert "| sao | 3.59 | 3.27 | 21.56 | 19.62 | 0.51 | 0.85 |" in text
  # 25 dumps × (success + failure), RL steps −10 (value pretraining) to 230.
  assert len(sao.traces) == 50 and {t.step for t in sao.traces} == set(range(-10, 231, 10))
  assert "| sao: 50 traces, 1,139 action tokens | this run | reported |" in text
  assert "| failure example (step 230) V first → last | 0.921 → 0.885 | 0.187 → 0.004 |" in text
  assert "| success mean > paired failure mean | 19 of 25 | 19 of 20 |" in text
  assert "| \\|ΔV\\| > 0.1 at message boundaries | 33.09 % of 139 | 1.86 % of 3,450 |" in text
  assert "| \\|ΔV\\| > 0.1 within turns | 10.21 % of 950 | 0.20 % of 955,928 |" in text
  assert "| boundary / within-turn jump rate | 3.2× | 9.2× |" in text


def test_recorded_runs_figures(sao, tmp_path):
  paths = figures.write_all([sao], reported.ALL, str(tmp_path))
  assert sorted(os.path.basename(p) for p in paths) == ["fig2_steps.png", "fig3_time.png", "fig5_diagnostics.png",
                                                        "fig7_critic_sao.png", "sao_curves.png"]
  for path in paths:
    assert os.path.getsize(path) > 10_000, path


def test_recorded_sao_vs_gspo(sao):
  gspo = runs.load_run("gspo", os.path.join(DATA, "gspo_toy"))
  text = tables.paper_tables([sao, gspo], reported.ALL, threshold=60.0, tables=[1, 2, 3])
  assert "| gspo | 45.7 | 64.0 | 77.3 | 70.40 | 221 | 71.1 | — | 73.9 | — |" in text
  assert "| sao | 142 | 9,152 | 12,800 | 41 | 2,688 | 1.1 |" in text
  assert "| gspo | 221 | 14,208 | 48,600 | 41 | 2,688 | 0.8 |" in text
  assert "35.6 % fewer (reported 73.7 %)" in text
  assert "| trajectories to best | 64.4 | 26.3 |" in text and "| rollouts per step | 100.0 | 12.5 |" in text
  assert "| gspo | 3.47 | 3.26 | 20.81 | 19.65 | 0.53 | 0.76 |" in text


def test_write_recorded_run_trims_to_the_paper_keys(tmp_path):
  src = tmp_path / "run"
  src.mkdir()
  records = [{"step": 0, "time": 1.23456, "validation": 0.5, "validation/num_tasks": 128.0, "hparams": {"a": 1}},
             {"step": 0, "time": 2.0, "reward": 0.1234567891, "actor/grad_norm": 3.0, "learner/unused": 7.0},
             {"step": 1, "time": 3.0, "reward": 0.5, "phase/rl": 1.0},
             {"step": 2, "time": 4.0, "reward": 0.6, "phase/rl": 1.0},
             {"step": 1, "time": 5.0, "reward": 0.75, "phase/rl": 1.0}]  # resumed from step 1: 1 and 2 superseded
  (src / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  (src / archive.CRITIC_TRACES_FILE).write_text('{"step": 0}\n')
  dst = tmp_path / "recorded"
  assert archive.write_recorded_run(str(src), str(dst)) == 3
  written = [json.loads(line) for line in (dst / "metrics.jsonl").read_text().splitlines()]
  assert written[1] == {"step": 0, "time": 2.0, "reward": 0.123457, "actor/grad_norm": 3.0}
  assert written[2]["reward"] == 0.75 and all("hparams" not in r for r in written)
  assert (dst / archive.CRITIC_TRACES_FILE).read_text() == '{"step": 0}\n'
  (src / archive.CRITIC_TRACES_FILE).unlink()  # a GSPO run over the same directory: no stale traces left
  archive.write_recorded_run(str(src), str(dst))
  assert not (dst / archive.CRITIC_TRACES_FILE).exists()
  with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
    archive.write_recorded_run(str(tmp_path / "missing"), str(dst))
