"""An SAO learner with V-trace critic targets (`sao.critic_target_correction = "vtrace"`) and the explained-variance
gate on the actor's start (`sao.actor_start = "critic_ev"`): the critic's targets are the float64 V-trace reference
on the pre-update values and policy, in the one-call and the length-grouped update; the actor waits for the gate."""
import json

import numpy as np
import pytest

from sao.train import learner_checkpoint
from sao.train.checkpoint import Checkpointer
from tests.core import reference as ref
from tests.train import helpers

_VTRACE = {"sao.critic_target_correction": "vtrace", "sao.lambda_critic": 0.9, "sao.vtrace_rho_bar": 1.0,
           "sao.vtrace_c_bar": 0.8}


def _check_vtrace_targets(learner, batch, metrics, traces, logprobs):
  c = learner.config.sao
  mask = np.asarray(batch["action_mask"], bool)
  log_ratio = np.asarray(logprobs, np.float64) - batch["rollout_logprobs"]
  want = ref.vtrace(batch["token_rewards"], traces["values"], log_ratio, mask, c.gamma, c.lambda_critic,
                    c.vtrace_rho_bar, c.vtrace_c_bar)
  np.testing.assert_allclose(traces["returns"], want, rtol=1e-4, atol=1e-4)
  k = np.exp(log_ratio)
  for name, bar in (("rho", c.vtrace_rho_bar), ("c", c.vtrace_c_bar)):
    fraction = np.sum(mask & (k > bar)) / mask.sum()
    assert 0.0 < fraction < 1.0  # the synthetic engine log-probs put ratios on both sides of the clip
    np.testing.assert_allclose(metrics[f"critic/vtrace_{name}_clipped_fraction"], fraction, atol=1.5 / mask.sum())


def test_vtrace_targets_and_the_ev_gate_in_the_one_call_update(tmp_path):
  # An unreachable threshold: only the cap (update 1) opens the gate.
  learner = helpers.make_learner(**_VTRACE, **{"sao.actor_start": "critic_ev", "sao.actor_start_ev_threshold": 1.0,
                                               "sao.actor_start_ev_window": 1, "sao.actor_start_max_steps": 1})
  versions = []
  for step in range(2):
    batch, _ = learner.make_batch(helpers.trajectories(seed=10 + step))
    logprobs, _ = learner.policy_logprobs(batch)
    metrics, traces = learner.update_traced(batch, list(range(batch["input_ids"].shape[0])))
    versions.append(learner.version)
    if step == 0:
      _check_vtrace_targets(learner, batch, metrics, traces, logprobs)
    assert metrics["actor/warmup"] == float(step < 1)
  assert versions == [0, 1]
  assert learner_checkpoint.metadata(learner)["actor_start"]["started_at"] == 1
  assert learner.actor_start.reason == "cap"
  # A resumed learner keeps the opened gate (the checkpoint's metadata), not a fresh window.
  checkpointer = Checkpointer(str(tmp_path / "ckpt"), every=1, max_to_keep=1)
  assert learner.save_checkpoint(checkpointer)
  checkpointer.wait()
  resumed = helpers.make_learner(learner.config)
  resumed.restore_checkpoint(checkpointer)
  checkpointer.close()
  assert resumed.actor_start.state_dict() == learner.actor_start.state_dict() and resumed.actor_start.decide(2)


def test_vtrace_targets_in_the_grouped_update_and_the_plan():
  learner = helpers.make_learner(**_VTRACE, **{"batching.length_groups": 2, "sao.critic_warmup_steps": 0})
  plans = []
  learner.agree = lambda tag, plan: plans.append(plan)
  batch, _ = learner.make_batch(helpers.trajectories(seed=21, min_len=4, max_len=30))
  logprobs, _ = learner.policy_logprobs(batch)
  metrics, traces = learner.update_traced(batch, list(range(batch["input_ids"].shape[0])))
  _check_vtrace_targets(learner, batch, metrics, traces, logprobs)
  assert learner.version == 1
  (plan,) = plans
  assert plan["critic_target_correction"] == "vtrace" and plan["values_before"] and plan["actor_step"]
  assert len(plan["groups"]) == 2
  assert json.loads(json.dumps(plan)) == plan  # what `coordination.agree` sends between processes


@pytest.mark.slow
@pytest.mark.parametrize("length_groups", [0, 2])
def test_vtrace_programs_are_precompiled(length_groups):
  """`Learner.precompile` compiles the actor's forward and the V-trace programs too: the updates compile nothing."""
  from tests.train.test_precompile import _MAX_LEN, _Compiles, _config  # pylint: disable=g-import-not-at-top
  learner = helpers.make_learner(_config("sao", **{"batching.length_groups": length_groups, **_VTRACE}))
  assert list(learner.precompile(8, _MAX_LEN))
  batches = [helpers.trajectories(seed=60, n=8, min_len=5, max_len=_MAX_LEN),
             helpers.trajectories(seed=61, n=8, min_len=5, max_len=14)]
  with _Compiles() as compiles:
    metrics = [learner.update(batch) for batch in batches]
  assert compiles.count == 0
  assert all("critic/vtrace_rho_mean" in m for m in metrics)
