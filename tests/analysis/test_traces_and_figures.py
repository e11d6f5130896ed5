"""Critic traces (format, picking, Table 5 with known answers), Figure 1 cost ratios, and every figure's PNG."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from experiments.paper import reported
from sao.analysis import critic_traces, figures, runs, tables


def _trace(step, kind, action_values, boundaries, reward=None, gap=1):
  """A trace whose action tokens carry `action_values`, each action segment separated by `gap` observation tokens
  at the (action-ordinal) `boundaries`; the returns are the reward on every token."""
  reward = (1.0 if kind == "success" else 0.0) if reward is None else reward
  mask, values, turn_starts = [], [], [0]
  for i, v in enumerate(action_values):
    if i in boundaries:
      mask += [False] * gap
      values += [0.0] * gap
      turn_starts += [len(mask) - gap, len(mask)]  # the observation message, then the next assistant message
    mask.append(True)
    values.append(v)
  n = len(mask)
  return critic_traces.CriticTrace(step=step, kind=kind, reward=reward, policy_version=step, task_id=f"t{step}{kind}",
                                   num_turns=len(boundaries) + 1, turn_boundaries=tuple(turn_starts),
                                   action_mask=np.asarray(mask), values=np.asarray(values),
                                   returns=np.full(n, reward), advantages=np.zeros(n))


def _traces():
  # `|` marks a message boundary between action tokens. Only two transitions exceed 0.1: step 0's success boundary
  # (+0.25) and step 10's success within-turn (+0.3).
  return [_trace(0, "success", [0.5, 0.55, 0.8, 0.85], {2}),  # 0.5 0.55 | 0.8 0.85
          _trace(0, "failure", [0.4, 0.32, 0.35, 0.36], {2}),  # 0.4 0.32 | 0.35 0.36
          _trace(10, "success", [0.6, 0.9, 0.95], {2}),  # 0.6 0.9 | 0.95
          _trace(10, "failure", [0.2, 0.12, 0.05, 0.0], {2}),  # 0.2 0.12 | 0.05 0.0
          _trace(20, "failure", [0.3, 0.22], set())]


def _write_run(tmp_path, name, records, traces=()):
  workdir = tmp_path / name
  os.makedirs(workdir, exist_ok=True)
  with open(workdir / "metrics.jsonl", "w") as f:
    f.write("".join(json.dumps(r) + "\n" for r in records))
  critic_traces.TraceWriter(str(workdir)).write(list(traces))
  return runs.load_run(name, str(workdir))


def _records(num_steps, seconds_per_step, batch, best_step, critic=True, pretrain=0):
  records = [{"step": s, "time": 0.0, "phase/value_pretrain": 1.0, "batch/num_trajectories": batch}
             for s in range(pretrain)]
  for t in range(num_steps):
    r = {"step": pretrain + t, "time": 1000.0 + seconds_per_step * t, "phase/rl": 1.0, "reward": 0.1 + 0.01 * t,
         "batch/num_trajectories": float(batch), "dropped": 0.0, "turns": 3.0, "response_length": 20.0}
    if critic:
      r.update({runs.EV_KEY: 0.01 * t, "advantages/mean_before_whiten": 0.0, "critic/grad_norm": 2.0,
                "actor/grad_norm": 0.5})
    records.append(r)
  for t in range(0, num_steps, 5):
    records.append({"step": pretrain + t, "time": 1000.0 + seconds_per_step * t, runs.EVAL_RECORD_KEY: 64.0,
                    "validation": 0.9 if t == best_step else 0.5})
  return records


def test_trace_round_trip_and_errors(tmp_path):
  trace = _traces()[0]
  back = critic_traces.CriticTrace.from_json(trace.to_json())
  np.testing.assert_array_equal(back.action_mask, trace.action_mask)
  np.testing.assert_allclose(back.values, trace.values)
  assert back.turn_boundaries == trace.turn_boundaries and back.kind == "success" and back.step == 0
  writer = critic_traces.TraceWriter(str(tmp_path))
  writer.write(_traces())
  with open(writer.path, "a") as f:
    f.write('{"step": 30, "kind": "succ')  # a crash mid-write
  assert len(critic_traces.read_traces(str(tmp_path))) == 5
  with open(writer.path, "a") as f:
    f.write('\n{"step": 1}\n' + trace.to_json() + "\n")
  with pytest.raises(ValueError, match=r"critic_traces.jsonl:6: bad critic trace"):  # torn, then written after
    critic_traces.read_traces(writer.path)
  with open(writer.path, "w") as f:
    f.write(trace.to_json() + '\n{"step": 1}\n')
  with pytest.raises(ValueError, match=r"critic_traces.jsonl:2: bad critic trace: .*missing field"):
    critic_traces.read_traces(writer.path)
  with pytest.raises(ValueError, match="values has shape"):
    critic_traces.CriticTrace(0, "success", 1.0, 0, "t", 1, (0,), np.ones(3, bool), np.ones(2), np.ones(3), np.ones(3))
  with pytest.raises(ValueError, match="kind 'win'"):
    critic_traces.CriticTrace(0, "win", 1.0, 0, "t", 1, (0,), np.ones(2, bool), np.ones(2), np.ones(2), np.ones(2))


def test_a_resumed_runs_later_dump_of_a_step_wins(tmp_path):
  writer = critic_traces.TraceWriter(str(tmp_path))
  writer.write(_traces())
  writer.write([_trace(10, "success", [0.1, 0.2], set())])  # the resumed run redoes step 10
  traces = critic_traces.read_traces(str(tmp_path))
  assert [(t.step, t.kind) for t in traces] == [(0, "success"), (0, "failure"), (10, "success"), (10, "failure"),
                                                (20, "failure")]
  np.testing.assert_allclose(traces[2].values[traces[2].action_mask], [0.1, 0.2])


def test_pick_rows():
  picks = critic_traces.pick_rows([0.0, 1.0, 0.0, 1.0, 1.0], seed=3)
  assert set(picks) == {"success", "failure"} and picks["success"] in (1, 3, 4) and picks["failure"] in (0, 2)
  assert critic_traces.pick_rows([0.0, 1.0, 0.0, 1.0, 1.0], seed=3) == picks  # deterministic per seed
  assert set(critic_traces.pick_rows([1.0, 0.5], seed=0)) == {"success"}
  assert critic_traces.pick_rows([0.0], seed=0) == {"failure": 0}


def test_critic_table_known_answers(tmp_path):
  run = _write_run(tmp_path, "sao", _records(30, 2.0, 8, 10, pretrain=4), [
      # Logged steps include 4 value-pretraining steps: step 14 is RL step 10.
      *[critic_traces.CriticTrace(**{**t.__dict__, "step": t.step + 4}) for t in _traces()]])
  assert sorted({t.step for t in run.traces}) == [0, 10, 20]
  success, failure = runs.selected_examples(run.traces)
  assert (success.step, failure.step) == (10, 10)  # the last step with both kinds
  text = tables.critic_table(run, reported.ALL)
  assert "| sao: 5 traces, 17 action tokens | this run | reported |" in text
  assert "| success example (step 10) V first → last | 0.600 → 0.950 | 0.895 → 1.000 |" in text
  # Halves of (0.6, 0.9, 0.95): first 0.6, second 0.925.
  assert "| success example ΔV; first-half / second-half mean | +0.350; 0.600 / 0.925 | — |" in text
  assert "| failure example (step 10) V first → last | 0.200 → 0.000 | 0.187 → 0.004 |" in text
  assert "| success mean > paired failure mean | 2 of 2 | 19 of 20 |" in text
  # 17 action tokens in 5 traces: 12 transitions, 4 at boundaries (one jumps) and 8 within turns (one jumps).
  assert "| \\|ΔV\\| > 0.1 at message boundaries | 25.00 % of 4 | 1.86 % of 3,450 |" in text
  assert "| \\|ΔV\\| > 0.1 within turns | 12.50 % of 8 | 0.20 % of 955,928 |" in text
  assert "| boundary / within-turn jump rate | 2.0× | 9.2× |" in text
  assert "## Table 5" in tables.paper_tables([run], reported.ALL, tables=[5])


def test_cost_ratios_and_normalized_time(tmp_path):
  # SAO: 3 s per step, 8 per step, best at step 10 → 11 × 8 = 88 trajectories. GSPO: 6 s, 32 per step, best at 5 →
  # 6 × 32 = 192.
  sao = _write_run(tmp_path, "sao", _records(20, 3.0, 8, 10, pretrain=2))
  gspo = _write_run(tmp_path, "gspo", _records(20, 6.0, 32, 5, critic=False))
  hours = runs.normalized_hours(sao)
  assert hours[0] == 0.0 and hours[10] == pytest.approx(30.0 / 3600) and -1 not in hours
  assert runs.step_seconds(sao) == pytest.approx(3.0)
  costs = runs.cost_ratios(sao, gspo, reported.ALL)
  assert costs["trajectories to best"][0] == pytest.approx(100 * 88 / 192)
  assert costs["trajectories to best"][1] == pytest.approx(100 * 12_800 / 48_600)
  assert costs["step duration"] == (pytest.approx(50.0), pytest.approx(100 / 5.36))
  assert costs["rollouts per step"] == (pytest.approx(25.0), pytest.approx(12.5))
  text = tables.paper_tables([sao, gspo], reported.ALL, threshold=80.0, tables=[2])
  assert "## Figure 1" in text and "| trajectories to best | 45.8 | 26.3 |" in text
  assert "| sao | 10 | 88 | 12,800 | 10 | 88 | 0.5 |" in text  # 10 steps × 3 s = 0.5 min to the threshold


def test_every_figure_is_written(tmp_path):
  sao = _write_run(tmp_path, "sao", _records(30, 2.0, 8, 10), _traces())
  initial = _write_run(tmp_path, "sao_initial", _records(30, 2.0, 8, 15))
  gspo = _write_run(tmp_path, "gspo", _records(30, 4.0, 32, 5, critic=False))
  paths = figures.write_all([sao, gspo, initial], reported.ALL, str(tmp_path / "out"))
  names = sorted(os.path.basename(p) for p in paths)
  assert names == sorted(["fig1_costs.png", "fig2_steps.png", "fig3_time.png", "fig4_recipes.png",
                          "fig5_diagnostics.png", "fig7_critic_sao.png", "sao_curves.png", "gspo_curves.png",
                          "sao_initial_curves.png"])
  for path in paths:
    with open(path, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(path) > 5000, path
  with pytest.raises(ValueError, match="axis"):
    figures.plot_behaviour([sao], str(tmp_path / "x.png"), axis="tokens")
  with pytest.raises(ValueError, match="no traces"):
    figures.plot_critic_traces([], str(tmp_path / "y.png"))
