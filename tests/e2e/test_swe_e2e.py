"""RL smoke run on the SWE-style environment through the full system: `sao_openswe.py:swe_toy` with the
mini-swe-agent-style `bash_only` scaffold (the shorter prompt of the two), so every episode goes worker → scaffold →
token-capturing proxy → local engine, runs commands in a sandboxed repository and is graded at the end. Kept short:
no warm start, one value-pretraining step, one RL step with an actor update, 2-turn episodes of ≤ 1536 tokens."""
from __future__ import annotations

import os

import pytest

from tests.e2e.test_train_e2e import Run, _metrics, _records, cache_dir, runs  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow

ARG = ("sao_openswe.py:swe_toy,total_steps=1,recipe.value_pretrain_steps=1,learner.sao.critic_warmup_steps=0,"
       "recipe.sft_steps=0,rollout.batch_size=2,rollout.concurrency=2,env.num_validation_tasks=1,log_every=1,"
       "rollout.max_turns=2,rollout.max_new_tokens=32,rollout.max_total_tokens=1536,checkpoint_every=100,"
       "rollout.harnesses=bash_only,rollout.harness_weights=1,rollout.eval_harness=bash_only")


def test_swe_toy_rl_smoke_through_the_proxy(tmp_path, runs, cache_dir):  # noqa: F811
  workdir = str(tmp_path / "run")
  run = Run(ARG, workdir, cache_dir, "swe")
  runs.append(run)
  out = run.finish(600)
  assert "[done] sao_openswe_swe_toy" in out
  records = _records(workdir)
  assert records and {r.trajectory.harness for r in records} == {"bash_only"}
  for r in records:
    t = r.trajectory
    assert t.metadata.get("env") == "swe" and t.num_turns >= 1, t.metadata
  assert os.path.isfile(os.path.join(workdir, "policy", "v1", "config.json")), "no actor update was published"
  assert any("reward/harness/bash_only" in row for row in _metrics(workdir))
