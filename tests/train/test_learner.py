"""Learner: warmup, recompilation, frozen params, micro-batching, NaN guard, sharding.

Every test uses the same model, learning rates and padded shape ([8, 16]), so compiled steps are shared through
the persistent compilation cache (conftest.py); the two equality tests share Adam eps = 1 (`_smooth_adam_config`).
"""
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao.train import actor_losses
from sao.train import mesh as mesh_lib
from sao.train import steps
from sao.train.learner import NonFiniteError
from tests.train import helpers


def test_warmup_frozen_params_and_no_recompilation():
  learner = helpers.make_learner(**{"sao.critic_warmup_steps": 2})
  assert learner.actor.counts.frozen == 0 and learner.critic.counts.frozen > 0
  # Frozen critic params have no optimizer state: the Adam moments hold only trainable leaves.
  num_trainable_leaves = sum(jax.tree.leaves(learner.critic.trainable))
  opt_leaves = [x for x in jax.tree.leaves(learner.critic.state.opt_state) if np.ndim(x) > 0]
  assert len(opt_leaves) == 2 * num_trainable_leaves
  assert sum(x.size for x in opt_leaves) == 2 * learner.critic.counts.trainable
  actor0 = jax.device_get(learner.actor_params)
  critic0 = jax.device_get(learner.critic_params)
  traces0 = dict(steps.TRACE_COUNTS)
  for update in range(4):
    metrics = learner.update(helpers.trajectories(seed=update))  # lengths 6..16: always the 16 bucket
    actor = jax.device_get(learner.actor_params)
    if update < 2:
      assert helpers.tree_equal(actor, actor0), "actor moved during the critic warmup"
      assert metrics["actor/warmup"] == 1.0 and learner.version == 0
    else:
      assert not helpers.tree_equal(actor, actor0), "actor did not move after the warmup"
      assert metrics["actor/warmup"] == 0.0 and "actor/dis_masked_fraction" in metrics
  assert learner.version == 2 and learner.num_updates == 4
  critic = jax.device_get(learner.critic_params)
  for (path, label), a, b in zip(jax.tree_util.tree_flatten_with_path(learner.critic.labels)[0],
                                 jax.tree.leaves(critic0), jax.tree.leaves(critic)):
    if label == "frozen":
      np.testing.assert_array_equal(a, b, err_msg=str(path))
    else:
      assert not np.array_equal(a, b), f"trainable {path} did not change"
  traced = {k: v - traces0.get(k, 0) for k, v in steps.TRACE_COUNTS.items() if v != traces0.get(k, 0)}
  assert traced == {"value": 1, "dis": 1}, traced
  for key in ("critic/explained_variance", "advantages/mean_before_whiten", "advantages/std", "critic/grad_norm",
              "actor/grad_norm", "actor/logprob_mismatch", "actor/mismatch_kl_k3", "actor/entropy",
              "batch/reward_mean", "batch/response_length_mean", "batch/staleness_mean", "actor/l2_updates"):
    assert np.isfinite(metrics[key]), key
  assert abs(metrics["advantages/mean"]) < 1e-5 and abs(metrics["advantages/std"] - 1.0) < 1e-3


def _smooth_adam_config(**overrides):
  """Adam with `eps = 1`: its first step moves a param by `lr·g/(|g| + eps)`, whose slope is at most `lr/eps`. With
  the default `eps = 1e-8` the slope at `g ≈ 0` is `lr/eps = 1e6`, so the float32 rounding of a near-zero gradient
  entry — which depends on the reduction order (micro-batches, shards, the CPU's vector width) — moves a param by up
  to `lr`. With `eps = 1` the params inherit the gradient's rounding, scaled down by `lr`: a comparison of params then
  tests the gradients, on every machine."""
  return helpers.learner_config(**{"actor.optimizer.eps": 1.0, "critic.optimizer.eps": 1.0, **overrides})


def _assert_gradients_close(full_opt_state, other_opt_state):
  """Adam's first moment after one step is `(1 − b1)·g`: the accumulated gradient, leaf by leaf. Each entry is a sum
  of B·T float32 terms (≤ 128 here) in a different order, so it carries up to ~128 ulp of the leaf's scale."""
  for x, y in zip(jax.tree.leaves(full_opt_state), jax.tree.leaves(other_opt_state)):
    np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-5 * float(np.max(np.abs(x))))


@pytest.mark.parametrize("micro", [{"batching.micro_batch_size": 2},
                                   {"batching.micro_batch_size": 0, "batching.micro_batch_by_length": "16:4,4096:2"}],
                         ids=["micro_batch_size", "by_length"])
def test_micro_batched_step_equals_full_batch(micro):
  trajs = helpers.trajectories(seed=3)
  results = []
  for overrides in ({"batching.micro_batch_size": 0}, micro):
    learner = helpers.make_learner(_smooth_adam_config(**overrides))
    batch, _ = learner.make_batch(trajs)
    rng = np.random.default_rng(0)
    actor_batch = steps.select(dict(batch, advantages=np.where(
        batch["action_mask"], rng.normal(size=batch["action_mask"].shape), 0.0).astype(np.float32)),
        actor_losses.get("dis").batch_keys, "test")
    learner.actor.state, metrics = learner._actor_steps["dis"](learner.actor.state, actor_batch,
                                                               jax.random.PRNGKey(0))
    results.append((jax.device_get(metrics), jax.device_get(learner.actor.state)))
  (m_full, s_full), (m_micro, s_micro) = results
  assert m_micro["tokens"] == m_full["tokens"]
  # Means over every action token of O(1)–O(10) terms, reduced in another order: ~1e-7 of that scale each.
  for key in ("loss", "grad_norm", "entropy", "logprob_mismatch", "mismatch_kl_k3", "dis_masked_fraction"):
    np.testing.assert_allclose(m_micro[key], m_full[key], rtol=1e-5, atol=1e-5, err_msg=key)
  _assert_gradients_close(s_full.opt_state, s_micro.opt_state)
  # Every param (lr = 1e-2, |Δg| ≲ 1e-5·max|g|): the update is the same.
  for x, y in zip(jax.tree.leaves(s_full.params), jax.tree.leaves(s_micro.params)):
    np.testing.assert_allclose(y, x, rtol=0, atol=1e-7)
  assert not helpers.tree_equal(s_full.params, helpers.actor_params())


def test_nan_guard_skips_counts_and_stops():
  learner = helpers.make_learner(**{"nan_guard_limit": 3, "sao.critic_warmup_steps": 5})
  state = learner.critic.state
  head = state.params["value_head"]["kernel"]
  learner.critic.state = state.replace(params=dict(state.params, value_head=dict(
      state.params["value_head"], kernel=head.at[0, 0].set(jnp.nan))))
  before = jax.device_get(learner.critic.state)
  metrics = learner.update(helpers.trajectories(seed=0))  # K = 2 critic steps, both non-finite
  assert metrics["critic/skipped_epoch0"] == 1.0 and metrics["critic/skipped_epoch1"] == 1.0
  after = jax.device_get(learner.critic.state)
  assert int(after.skipped) == 2 and int(after.step) == 0 and learner.critic.consecutive_nonfinite == 2
  np.testing.assert_array_equal(after.params["model"]["norm"]["scale"], before.params["model"]["norm"]["scale"])
  assert helpers.tree_equal(after.opt_state, before.opt_state)
  with pytest.raises(NonFiniteError, match="critic had 3 consecutive"):
    learner.update(helpers.trajectories(seed=1))


def test_sharded_update_equals_single_device():
  trajs = helpers.trajectories(seed=5)
  results = []
  for shape in ({"data": 1, "fsdp": 1, "expert": 1, "tensor": 1}, {"data": 2, "fsdp": 2, "expert": 1, "tensor": 2}):
    config = _smooth_adam_config(**{"sao.critic_warmup_steps": 0})
    config.mesh.update(shape)
    mesh = mesh_lib.make_mesh(shape, jax.devices()[:int(np.prod(list(shape.values())))])
    learner = helpers.make_learner(config, mesh=mesh)
    metrics = learner.update(trajs)
    results.append((metrics, jax.device_get(learner.actor.state), jax.device_get(learner.critic.state)))
  (m1, a1, c1), (m8, a8, c8) = results
  # K = 2 critic steps, the advantages from the updated critic, then the actor step: every quantity is a smooth
  # function of the gradients (Adam with eps = 1), so the whole update agrees to float32 rounding. The scalars are
  # means of O(1)–O(10) terms (the loss and explained variance cancel to far less): ~1e-7 of that scale each.
  for key in ("actor/loss", "actor/grad_norm", "critic/loss_epoch0", "critic/loss_epoch1", "critic/grad_norm",
              "critic/explained_variance", "advantages/std_before_whiten", "actor/entropy"):
    np.testing.assert_allclose(m8[key], m1[key], rtol=1e-5, atol=1e-5, err_msg=key)
  for one, eight in ((a1, a8), (c1, c8)):
    _assert_gradients_close(one.opt_state, eight.opt_state)  # the critic's: (1 − b1)·(b1·g₁ + g₂) — still linear
    for x, y in zip(jax.tree.leaves(one.params), jax.tree.leaves(eight.params)):
      np.testing.assert_allclose(y, x, rtol=0, atol=1e-7)


def test_update_traced_returns_pre_update_critic_view_of_the_rows(caplog):
  with caplog.at_level(logging.INFO):
    learner = helpers.make_learner()
  # The parameter table at start (clu.parameter_overview), with each parameter's mesh sharding.
  table = "\n".join(r.getMessage() for r in caplog.records if "critic parameters" in r.getMessage())
  assert "model/layers_0/mlp/up_proj/kernel" in table and "value_head/kernel" in table and "Sharding" in table
  batch, stats = learner.make_batch(helpers.trajectories(seed=5))
  values_before = np.asarray(jax.device_get(learner.critic_values(batch)))
  metrics, traces = learner.update_traced(batch, [3, 0])
  assert set(traces) == {"values", "returns", "advantages"} and learner.num_updates == 1
  for array in traces.values():
    assert array.shape == (2, batch["input_ids"].shape[1]) and array.dtype == np.float32
  np.testing.assert_allclose(traces["values"], values_before[[3, 0]], rtol=1e-6)
  # The critic moved: the traced values are the pre-update ones.
  assert not np.allclose(np.asarray(jax.device_get(learner.critic_values(batch)))[[3, 0]], traces["values"])
  # γ = λ_critic = 1: the return target on every action token is the trajectory's reward (terminal reward only).
  for row, i in enumerate([3, 0]):
    mask = batch["action_mask"][i]
    np.testing.assert_allclose(traces["returns"][row][mask], batch["rewards"][i], rtol=1e-5, atol=1e-6)
  assert stats.source_indices == tuple(range(8))
  assert learner.update_traced(batch, [])[1] == {}
