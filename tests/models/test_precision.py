"""bf16 mixed precision (issue 19 item 4): bf16 params and compute, float32 statistics, optimizer state and master
weights.

- The bf16 model (params cast from the float32 ones, bf16 activations) gives log-probs and critic values within a
  stated tolerance of the float32 model.
- In the bf16 jaxpr every normalisation (rsqrt), softmax / log-softmax statistic (exp, log, max), the router's top-k
  and the losses' inputs are float32; the big matmuls take bf16 operands.
- With master weights the optimizer state (Adam moments, master copy) is float32 and the bf16 params are the cast of
  the master; an update smaller than bf16's spacing moves the master and not the params.
- A learner update (SAO: critic and actor steps) runs end to end with bf16 params.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from sao.models.config import ModelConfig
from sao.models.logprobs import token_logprobs
from sao.models.transformer import Critic, init_params
from sao.train import config as config_lib
from sao.train import optim
from sao.train.learner import Learner
from tests.train import helpers as train_helpers

# Tolerance of the bf16 forward against float32 on the tiny models (hidden 64, 2 layers, random init, log-probs
# ≈ −4.2): bf16 keeps 8 significant bits (relative spacing 2^-8 ≈ 0.004). Measured max |Δ| 0.0022 (qwen3), 0.0027
# (qwen3_moe), 0.010 (qwen3_5_moe_text), mean |Δ| ≤ 0.00084; the bounds leave 5× room for other rounding orders.
LOGPROB_ATOL = 0.05
# Mean |Δ| over the tokens: a systematic error (a statistic computed in bf16) shows here first.
LOGPROB_MEAN_ATOL = 0.005


def _bf16(config: ModelConfig) -> ModelConfig:
  return dataclasses.replace(config, dtype="bfloat16", param_dtype="bfloat16")


def _cast(params, dtype):
  return jax.tree.map(lambda x: x.astype(dtype), params)


def _batch(vocab: int, b: int = 2, t: int = 24):
  rng = np.random.default_rng(0)
  ids = rng.integers(0, vocab, (b, t)).astype(np.int32)
  mask = np.ones((b, t), np.int32)
  mask[1, :5] = 0  # left padding
  return jnp.asarray(ids), jnp.asarray(mask)


@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen3_5_moe_text"])
def test_bf16_forward_close_to_float32(model_type):
  config = ModelConfig.tiny(model_type)
  params = init_params(config, jax.random.PRNGKey(0))
  ids, mask = _batch(config.vocab_size)
  lp32 = jax.jit(token_logprobs, static_argnums=1)(params, config, ids, mask)
  lp16 = jax.jit(token_logprobs, static_argnums=1)(_cast(params, jnp.bfloat16), _bf16(config), ids, mask)
  assert lp16.dtype == jnp.float32  # log-probs are float32 whatever the compute dtype
  diff = np.abs(np.asarray(lp16) - np.asarray(lp32))[np.asarray(mask, bool)]
  assert diff.max() < LOGPROB_ATOL and diff.mean() < LOGPROB_MEAN_ATOL, (diff.max(), diff.mean())
  assert diff.max() > 0  # it did run in bf16


def _eqns(jaxpr):
  """Every equation of a closed jaxpr, sub-jaxprs (scan, remat, custom_vjp, pjit) included."""
  for eqn in jaxpr.eqns:
    yield eqn
    for param in eqn.params.values():
      for sub in (param if isinstance(param, (list, tuple)) else [param]):
        inner = getattr(sub, "jaxpr", None)
        if inner is not None and hasattr(inner, "eqns"):
          yield from _eqns(inner)
        elif hasattr(sub, "eqns"):
          yield from _eqns(sub)


# Primitives that compute statistics: norms (rsqrt), softmax / log-sum-exp (exp, log, reduce_max), routing (top_k).
STATISTICS = {"rsqrt", "exp", "log", "log1p", "reduce_max", "top_k"}


@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen3_5_moe_text"])
def test_bf16_statistics_stay_float32_and_matmuls_run_in_bf16(model_type):
  config = _bf16(ModelConfig.tiny(model_type, attention_impl="blockwise"))
  params = _cast(init_params(config, jax.random.PRNGKey(0)), jnp.bfloat16)
  critic_params = _cast(init_params(config, jax.random.PRNGKey(1), critic=True), jnp.bfloat16)
  ids, mask = _batch(config.vocab_size)

  def loss(p, cp):  # the actor's log-probs and the critic's values, differentiated (backward pass included)
    lp, ent = token_logprobs(p, config, ids, mask, return_entropy=True)
    values = Critic(config).apply({"params": cp}, ids, mask)
    return jnp.sum(lp) + jnp.sum(ent) + jnp.sum(jnp.square(values))

  jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(params, critic_params)
  stats = [e for e in _eqns(jaxpr.jaxpr) if e.primitive.name in STATISTICS]
  assert {e.primitive.name for e in stats} >= {"rsqrt", "exp", "log", "top_k"}
  low = [(e.primitive.name, str(v.aval)) for e in stats for v in e.invars
         if hasattr(v, "aval") and jnp.issubdtype(v.aval.dtype, jnp.floating) and v.aval.dtype != jnp.float32]
  assert not low, f"statistics computed below float32: {low[:5]}"
  dots = [e for e in _eqns(jaxpr.jaxpr) if e.primitive.name in ("dot_general", "ragged_dot")]
  bf16_dots = [e for e in dots if all(v.aval.dtype == jnp.bfloat16 for v in e.invars)]
  # The projections, experts and unembedding run in bf16 (the router and the value head are float32 by design).
  assert len(bf16_dots) > len(dots) / 2, (len(bf16_dots), len(dots))


def _opt_config(master_weights: bool, learning_rate: float = 1e-2):
  c = config_lib.default_learner_config().actor.optimizer
  c.unlock()
  c.learning_rate, c.warmup_steps, c.master_weights = learning_rate, 0, master_weights
  return c


def test_master_weights_are_float32_and_params_their_cast():
  config = _bf16(ModelConfig.tiny("qwen3"))
  params = _cast(init_params(config, jax.random.PRNGKey(0)), jnp.bfloat16)
  tx, _, _ = optim.make_optimizer(_opt_config(True), params, (".*self_attn.*",), "actor")
  state = jax.jit(tx.init)(params)
  float_leaves = [x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)]
  assert float_leaves and all(x.dtype == jnp.float32 for x in float_leaves)
  masters = [x.master for x in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, optim.MasterWeightsState))
             if isinstance(x, optim.MasterWeightsState)]
  assert len(masters) == 1
  master_kernel = masters[0]["model"]["layers_0"]["mlp"]["up_proj"]["kernel"]
  assert master_kernel.dtype == jnp.float32
  assert isinstance(masters[0]["model"]["layers_0"]["self_attn"]["q_proj"]["kernel"], optax.MaskedNode)  # frozen

  grads = jax.tree.map(lambda p: jnp.full(p.shape, 0.5, p.dtype), params)
  update = jax.jit(lambda g, s, p: (lambda u, s2: (optim.apply_updates(p, u, s2), s2))(*tx.update(g, s, p)))
  new, state = update(grads, state, params)
  master = [x.master for x in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, optim.MasterWeightsState))
            if isinstance(x, optim.MasterWeightsState)][0]
  up, master_up = new["model"]["layers_0"]["mlp"]["up_proj"]["kernel"], master["model"]["layers_0"]["mlp"]["up_proj"]
  assert up.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(up), np.asarray(master_up["kernel"].astype(jnp.bfloat16)))
  assert not np.array_equal(np.asarray(up), np.asarray(params["model"]["layers_0"]["mlp"]["up_proj"]["kernel"]))
  q = new["model"]["layers_0"]["self_attn"]["q_proj"]["kernel"]  # frozen: unchanged
  np.testing.assert_array_equal(np.asarray(q), np.asarray(params["model"]["layers_0"]["self_attn"]["q_proj"]["kernel"]))


def test_small_updates_accumulate_in_the_master_not_in_bf16():
  """At lr 1e-6 an Adam update (~lr per step) is far below bf16's spacing at |w| ~ 0.02 (2^-14 ≈ 6e-5): without
  master weights the bf16 params never move; with them the float32 master moves every step."""
  params = {"w": jnp.full((4, 4), 0.02, jnp.bfloat16)}
  grads = {"w": jnp.ones((4, 4), jnp.bfloat16)}
  for master_weights in (False, True):
    tx, _, _ = optim.make_optimizer(_opt_config(master_weights, learning_rate=1e-6), params, (), "actor")
    state, p = tx.init(params), params
    for _ in range(3):
      updates, state = tx.update(grads, state, p)
      p = optim.apply_updates(p, updates, state)
    np.testing.assert_array_equal(np.asarray(p["w"]), np.asarray(params["w"]))  # bf16 cannot hold 0.02 − 3e-6
    if master_weights:
      master = state.inner_states["trainable"].inner_state.master["w"]
      start = float(params["w"][0, 0])  # bf16(0.02) = 0.0200195…
      np.testing.assert_allclose(np.asarray(master), start - 3e-6, rtol=0, atol=1e-9)
      assert master.dtype == jnp.float32


def test_float32_without_master_weights_is_plain_adamw():
  """The toy configs' optimizer state keeps its structure and values (no wrapper state)."""
  params = init_params(ModelConfig.tiny("qwen3"), jax.random.PRNGKey(0))
  tx, _, _ = optim.make_optimizer(_opt_config(False), params, (), "actor")
  state = jax.jit(tx.init)(params)
  assert not [x for x in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, optim.MasterWeightsState))
              if isinstance(x, optim.MasterWeightsState)]
  plain = optax.adamw(1e-2, weight_decay=0.0, mask=lambda t: jax.tree.map(lambda p: p.ndim >= 2, t))
  grads = jax.tree.map(lambda p: jnp.full(p.shape, 0.1, p.dtype), params)
  updates, _ = jax.jit(tx.update)(grads, state, params)
  reference = optax.chain(optax.clip_by_global_norm(1.0), plain)
  expected, _ = jax.jit(reference.update)(grads, reference.init(params), params)
  for a, b in zip(jax.tree.leaves(updates), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-9)


def test_learner_update_runs_in_bf16_with_master_weights():
  config = _bf16(train_helpers.model_config())
  params = _cast(train_helpers.actor_params(), jnp.bfloat16)
  learner = Learner(train_helpers.learner_config(**{
      "sao.critic_warmup_steps": 0, "actor.optimizer.master_weights": True,
      "critic.optimizer.master_weights": True}), config, params, mesh=train_helpers.one_device_mesh())
  before = jax.tree.map(np.asarray, learner.actor.state.params)
  metrics = learner.update(train_helpers.trajectories(seed=0))
  assert np.isfinite(metrics["actor/loss"]) and np.isfinite(metrics["critic/loss"]), metrics
  assert metrics["actor/skipped"] == 0 and metrics["critic/skipped"] == 0
  for role in (learner.actor, learner.critic):
    assert {x.dtype for x in jax.tree.leaves(role.state.params)} == {jnp.dtype(jnp.bfloat16)}
    opt_floats = {x.dtype for x in jax.tree.leaves(role.state.opt_state) if jnp.issubdtype(x.dtype, jnp.floating)}
    assert opt_floats == {jnp.dtype(jnp.float32)}
  after = learner.actor.state.params
  moved = [not np.array_equal(a, np.asarray(b)) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after))]
  assert any(moved)


def test_bf16_master_weights_checkpoint_restores_exactly(tmp_path):
  """A checkpoint of bf16 params + float32 master weights and moments restores every leaf with its dtype, and the
  restored learner's next update equals the original's (the master copy, not the bf16 cast, carries on)."""
  from sao.train.checkpoint import Checkpointer  # pylint: disable=g-import-not-at-top
  config = _bf16(train_helpers.model_config())
  params = _cast(train_helpers.actor_params(), jnp.bfloat16)
  overrides = {"sao.critic_warmup_steps": 0, "actor.optimizer.master_weights": True,
               "critic.optimizer.master_weights": True}

  def make():
    return Learner(train_helpers.learner_config(**overrides), config, params, mesh=train_helpers.one_device_mesh())

  learner = make()
  # After an update the float32 masters differ from the bf16 params' upcast: a master re-derived from the params on
  # restore (instead of the saved one) would give a different next update.
  learner.update(train_helpers.trajectories(seed=0))
  checkpointer = Checkpointer(str(tmp_path / "ckpt"), every=1, max_to_keep=1, async_save=False)
  learner.save_checkpoint(checkpointer, extra={"step": 1})
  restored = make()
  assert restored.restore_checkpoint(checkpointer) == {"step": 1}
  checkpointer.close()
  for role, other in ((learner.actor, restored.actor), (learner.critic, restored.critic)):
    saved, back = jax.device_get(role.state), jax.device_get(other.state)
    assert [x.dtype for x in jax.tree.leaves(saved)] == [x.dtype for x in jax.tree.leaves(back)]
    assert train_helpers.tree_equal(saved, back)
  learner.update(train_helpers.trajectories(seed=1))
  restored.update(train_helpers.trajectories(seed=1))
  assert train_helpers.tree_equal(jax.device_get(learner.actor.state), jax.device_get(restored.actor.state))
  assert train_helpers.tree_equal(jax.device_get(learner.critic.state), jax.device_get(restored.critic.state))
