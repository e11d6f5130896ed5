"""End to end: `sao_mixed_harness.py:toy` (three tool syntaxes sampled at equal weights) runs a few steps through
every process (trainer, local engine, rollout worker): trajectories of every harness reach the durable log, the
metrics carry per-harness rewards and the validation harness's success rate. Kept short: a handful of SFT
demonstrations and two RL steps (reuses `test_train_e2e`'s run helpers)."""
from __future__ import annotations

import collections

import pytest

from tests.e2e.test_train_e2e import Run, _metrics, _records, cache_dir, runs  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow

ARG = ("sao_mixed_harness.py:toy,total_steps=2,recipe.value_pretrain_steps=1,learner.sao.critic_warmup_steps=1,"
       "recipe.sft_steps=5,recipe.num_demonstrations=30,log_every=1,rollout.eval_every=1,rollout.batch_size=12,"
       "rollout.concurrency=12,rollout.max_new_tokens=16,env.num_validation_tasks=3,checkpoint_every=100,"
       "server.buffer_capacity=12")
HARNESSES = {"xml_json", "json_block", "function_call"}


def test_mixed_harness_toy_runs_through_the_system(tmp_path, runs, cache_dir):  # noqa: F811
  workdir = str(tmp_path / "run")
  run = Run(ARG, workdir, cache_dir, "mixed")
  runs.append(run)
  out = run.finish(600)
  assert "[done]" in out
  harnesses = collections.Counter(r.trajectory.harness for r in _records(workdir))
  assert HARNESSES <= set(harnesses), harnesses
  rows = _metrics(workdir)
  reward_keys = {k for r in rows for k in r if k.startswith("reward/harness/")}
  assert reward_keys and reward_keys <= {f"reward/harness/{h}" for h in HARNESSES}, reward_keys
  assert any("validation/harness/xml_json" in r for r in rows), "no per-harness validation metric"
