"""experiments/bench/pipeline_recording.py: the sync mode's lease gate and the per-mode summary of a recorded timeline
(a stand-in trainer with known timestamps; the bench itself runs the real trainer)."""
from __future__ import annotations

import inspect
import types

import pytest

from experiments.bench import pipeline_recording


def test_lease_gate_hands_out_only_the_opened_training_leases():
  def lease(worker_id, max_tasks):
    return [types.SimpleNamespace(is_validation=False)] * max_tasks

  gate = pipeline_recording.LeaseGate(lease)
  assert gate.lease("w", 8) == []  # closed until the first step opens it
  gate.open(3)
  assert len(gate.lease("w", 2)) == 2 and len(gate.lease("w", 2)) == 1 and gate.lease("w", 2) == []


def test_summarize_mode_measures_after_the_warmup():
  trainer = types.SimpleNamespace(
      waits=[(0.0, 1.0), (2.0, 3.0), (5.0, 6.0)], end_time=8.0, server=None, taken_staleness=[[0], [1, 0], [2, 2]],
      published_at=[1.5, 4.0, 7.0], publish_started=[1.2, 3.5, 6.5], episode_s=[(1.0, 9.0), (4.0, 0.5)],
      leased_at={"a": 0.5}, taken=[{"leased_at": 2.5, "turns": 3}], turns=[1.0, 2.0, 4.0],
      timings=[{"generate_s": 1.0, "tool_s": 0.0, "total_s": 1.0}] * 3)
  out = pipeline_recording.summarize_mode("async", trainer, [(4.5, 1)], warmup=1, batch_size=4)
  # Measured: the last two steps, from t = 2 (the first measured wait) to t = 8: 6 s, 2 of them waiting.
  assert out["wall_s"] == 6.0 and out["steps"] == 2
  assert out["traj_per_s"] == pytest.approx(8 / 6) and out["busy"] == pytest.approx(1 - 2 / 6)
  assert out["train_step_s"] == [2.0, 2.0] and out["warmup_train_step_s"] == [1.0]
  assert out["staleness"] == [1, 0, 2, 2] and out["staleness_mean"] == pytest.approx(1.25)
  assert out["episode_s"] == [0.5] and out["turns_mean"] == 3.0
  assert out["publish_fraction_mean"] == pytest.approx((0.5 + 0.5) / 2)  # 4.0 in (3, 5), 7.0 in (6, 8)
  assert out["engine_publish_fraction_mean"] == pytest.approx(0.75)
  assert out["timeline"]["first_lease"] == -1.5 and out["taken"] == [{"leased_at": 0.5, "turns": 3}]


def test_the_bench_trainer_overrides_keep_the_trainer_signatures():
  """The bench's Trainer subclass overrides private methods the trainer calls: their parameters must stay the
  trainer's (a renamed parameter would only fail when the benchmark runs, minutes in)."""
  from sao.train.trainer import Trainer
  bench_trainer = pipeline_recording.bench_trainer_class()
  for name in ("_publish", "_take", "_server"):
    assert (list(inspect.signature(getattr(bench_trainer, name)).parameters) ==
            list(inspect.signature(getattr(Trainer, name)).parameters)), name


def test_the_bench_trainer_fields_do_not_shadow_the_trainers():
  """The bench's own per-step records must not reuse a name the trainer assigns: the trainer replaced the bench's
  `staleness` list with its staleness controller (or None) in `_server`, and the bench's first `_take` then failed."""
  import ast
  import pathlib
  from sao.train import trainer as trainer_lib

  def assigned(source: str, only: str | None = None) -> set[str]:
    tree = ast.parse(source)
    if only is not None:
      tree = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == only)
    return {t.attr for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}

  bench = pathlib.Path(pipeline_recording.__file__).read_text(encoding="utf-8")
  bench_init = next(n for n in ast.walk(ast.parse(bench)) if isinstance(n, ast.ClassDef) and n.name == "BenchTrainer")
  ours = assigned(ast.unparse(bench_init), only="__init__")
  theirs = assigned(pathlib.Path(trainer_lib.__file__).read_text(encoding="utf-8"))
  assert "taken_staleness" in ours and "staleness" in theirs  # the check reads what it should
  assert not ours & theirs, sorted(ours & theirs)
