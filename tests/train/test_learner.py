"""Learner: warmup, recompilation, frozen params, micro-batching, NaN guard, sharding.

Every test uses the same model, learning rates and padded shape ([8, 16]), so compiled steps are shared through
the persistent compilation cache (conftest.py).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
  traced = {k: v - traces0.get(k, 0) for k, v in steps.TRACE_COUNTS.items()}
  assert traced == {"value": 1, "dis": 1}, traced
  for key in ("critic/explained_variance", "advantages/mean_before_whiten", "advantages/std", "critic/grad_norm",
              "actor/grad_norm", "actor/logprob_mismatch", "actor/mismatch_kl_k3", "actor/entropy",
              "batch/reward_mean", "batch/response_length_mean", "batch/staleness_mean", "actor/l2_updates"):
    assert np.isfinite(metrics[key]), key
  assert abs(metrics["advantages/mean"]) < 1e-5 and abs(metrics["advantages/std"] - 1.0) < 1e-3


def test_micro_batched_step_equals_full_batch():
  trajs = helpers.trajectories(seed=3)
  results = []
  for micro in (0, 2):
    learner = helpers.make_learner(**{"batching.micro_batch_size": micro})
    batch, _ = learner.make_batch(trajs)
    rng = np.random.default_rng(0)
    actor_batch = {k: batch[k] for k in steps.ACTOR_KEYS["dis"][:-1]}
    actor_batch["advantages"] = np.where(batch["action_mask"], rng.normal(size=batch["action_mask"].shape),
                                         0.0).astype(np.float32)
    learner.actor.state, metrics = learner._actor_steps["dis"](learner.actor.state, actor_batch,
                                                               jax.random.PRNGKey(0))
    results.append((jax.device_get(metrics), jax.device_get(learner.actor.state)))
  (m_full, s_full), (m_micro, s_micro) = results
  for key in ("loss", "grad_norm", "entropy", "logprob_mismatch", "tokens"):
    np.testing.assert_allclose(m_micro[key], m_full[key], rtol=1e-6, err_msg=key)
  # After one step Adam's first moment is (1 − b1)·g: the accumulated gradient itself, leaf by leaf (entries that
  # are sums of cancelling terms carry float32 rounding relative to the leaf's scale).
  for x, y in zip(jax.tree.leaves(s_full.opt_state), jax.tree.leaves(s_micro.opt_state)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6 * float(np.max(np.abs(x))))
  # Params move by ≈ lr·g/(|g| + eps): a gradient entry near eps amplifies float rounding, hence 1e-5.
  for x, y in zip(jax.tree.leaves(s_full.params), jax.tree.leaves(s_micro.params)):
    np.testing.assert_allclose(x, y, atol=1e-5)


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
  for shape in ({"data": 1, "fsdp": 1, "tensor": 1}, {"data": 2, "fsdp": 2, "tensor": 2}):
    config = helpers.learner_config(**{"sao.critic_warmup_steps": 0})
    config.mesh.update(shape)
    mesh = mesh_lib.make_mesh(shape, jax.devices()[:int(np.prod(list(shape.values())))])
    learner = helpers.make_learner(config, mesh=mesh)
    metrics = learner.update(trajs)
    results.append((metrics, jax.device_get(learner.actor.state), jax.device_get(learner.critic.state)))
  trainable = {"actor": jax.tree.leaves(learner.actor.trainable), "critic": jax.tree.leaves(learner.critic.trainable)}
  (m1, a1, c1), (m8, a8, c8) = results
  for key in ("actor/loss", "actor/grad_norm", "critic/loss_epoch0", "critic/loss_epoch1", "critic/grad_norm",
              "critic/explained_variance", "advantages/std_before_whiten", "actor/entropy"):
    np.testing.assert_allclose(m8[key], m1[key], rtol=1e-5, atol=1e-6, err_msg=key)
  for role, one, eight in (("actor", a1, a8), ("critic", c1, c8)):
    # Adam moments: (1 − b1)·Σ g and (1 − b2)·Σ g² — the sharded gradients, leaf by leaf.
    for x, y in zip(jax.tree.leaves(one.opt_state), jax.tree.leaves(eight.opt_state)):
      np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5 * float(np.max(np.abs(x))))
    # Adam's first step moves a param by ≈ lr·g/(|g| + eps), whose slope at g ≈ 0 is lr/eps: gradient entries at
    # float32 noise level (all-reduce order) legitimately move differently. Compare where the gradient is resolved.
    pairs = [(x, y) for x, y, t in zip(jax.tree.leaves(one.params), jax.tree.leaves(eight.params), trainable[role])
             if t]
    mu = [x for x in jax.tree.leaves(one.opt_state) if np.ndim(x) > 0][:len(pairs)]  # mu, then nu
    for (x, y), m in zip(pairs, mu):
      assert x.shape == m.shape
      resolved = np.abs(m) > 1e-4 * np.max(np.abs(m))
      assert resolved.any()
      np.testing.assert_allclose(x[resolved], y[resolved], atol=1e-5)


def test_update_traced_returns_pre_update_critic_view_of_the_rows():
  learner = helpers.make_learner()
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
