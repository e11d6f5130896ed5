"""Routed, dropless MoE (`sao.models.moe`) = the dense oracle: grouped matmuls, full models (logits, log-probs,
actor and critic gradients, padding), an expert-sharded mesh of the 8 fake devices, and XLA's FLOP count."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sao.models import moe
from sao.models.config import ModelConfig
from sao.models.layers import MoE
from sao.models.logprobs import token_logprobs
from sao.models.sharding import batch_sharding, param_shardings
from sao.models.transformer import CausalLM, Critic
from tests.models.helpers import padded_batch, random_params

# float32 sums in another order (sorted rows, per-tile matmuls, psum over shards, GSPMD partial sums), relative to
# the largest magnitude compared: measured ≤ 1.7e-5 (log-probs of the 2-layer hybrid on the expert-sharded mesh).
ATOL = 5e-5


def _reference_grouped(lhs, rhs, sizes):
  out = np.zeros((lhs.shape[0], rhs.shape[2]), np.float64)
  start = 0
  for g, n in enumerate(sizes):
    out[start:start + n] = lhs[start:start + n].astype(np.float64) @ rhs[g].astype(np.float64)
    start += n
  return out


@pytest.mark.parametrize("impl", ["tiled", "ragged_dot", "auto"])
@pytest.mark.parametrize("sizes", [[3, 0, 5, 1], [0, 0, 9, 0], [2, 1, 0, 3]])  # the last leaves 3 rows ungrouped
def test_grouped_matmul_matches_loop(impl, sizes):
  rng = np.random.default_rng(0)
  lhs = rng.standard_normal((9, 6)).astype(np.float32)
  rhs = rng.standard_normal((4, 6, 5)).astype(np.float32)
  got = jax.jit(lambda a, b, s: moe.grouped_matmul(a, b, s, impl=impl))(lhs, rhs, np.array(sizes, np.int32))
  np.testing.assert_allclose(np.asarray(got), _reference_grouped(lhs, rhs, sizes), atol=1e-5)
  with pytest.raises(ValueError, match="impl"):
    moe.grouped_matmul(lhs, rhs, np.array(sizes, np.int32), impl="nonsense")


def test_tpu_lowering_uses_ragged_dot_and_cpu_the_tiles():
  """The platform is chosen when lowering: a TPU lowering from this CPU host holds XLA's ragged dot, a CPU one not."""
  args = (jax.ShapeDtypeStruct((16, 8), jnp.float32), jax.ShapeDtypeStruct((4, 8, 6), jnp.float32),
          jax.ShapeDtypeStruct((4,), jnp.int32))
  traced = jax.jit(moe.grouped_matmul).trace(*args)
  assert "chlo.ragged_dot" in traced.lower(lowering_platforms=("tpu",)).as_text()
  assert "ragged_dot" not in traced.lower(lowering_platforms=("cpu",)).as_text()


def test_moe_impl_is_validated():
  with pytest.raises(ValueError, match="moe_impl: unsupported 'sparse'"):
    ModelConfig.tiny("qwen3_moe", moe_impl="sparse")
  assert "moe_impl" not in ModelConfig.tiny("qwen3_moe", moe_impl="dense").to_hf()  # ours, not HF architecture


def _configs(model_type, norm_topk_prob):
  routed = ModelConfig.tiny(model_type, norm_topk_prob=norm_topk_prob)
  assert routed.moe_impl == "routed"
  return routed, routed.replace(moe_impl="dense")


def _actor_loss(config, params, ids, mask):
  logp = token_logprobs(params, config, ids, mask)
  return jnp.sum(logp * mask), logp


def _actor_loss_and_logits(config, params, ids, mask):
  loss, logp = _actor_loss(config, params, ids, mask)
  logits, _ = CausalLM(config).apply({"params": params}, ids, mask)
  return loss, (logp, logits)


def _critic_loss(config, params, ids, mask):
  values = Critic(config).apply({"params": params}, ids, mask)
  return jnp.sum(jnp.square(values) * mask)


def _assert_close(got, want, atol=ATOL, err_msg=""):
  """Within atol × the largest magnitude of `want` (log-probs reach ~10, gradients ~20: sums in another order)."""
  want = np.asarray(want)
  scale = max(1.0, float(np.abs(want).max()))
  np.testing.assert_allclose(np.asarray(got), want, atol=atol * scale, err_msg=err_msg)


def _assert_trees_close(got, want, atol=ATOL):
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
    _assert_close(g, w, atol, err_msg=jax.tree_util.keystr(path))


# qwen3_5_moe always renormalises the top-k (its HF config has no norm_topk_prob field); qwen3_moe has both kinds.
@pytest.mark.parametrize("model_type, norm_topk_prob",
                         [("qwen3_moe", True), ("qwen3_moe", False), ("qwen3_5_moe_text", True)])
def test_routed_equals_dense(model_type, norm_topk_prob):
  routed, dense = _configs(model_type, norm_topk_prob)
  ids, mask = padded_batch(np.random.default_rng(1), routed.vocab_size, [8, 3, 6], 8, left=norm_topk_prob)
  actor = random_params(routed, seed=3)
  critic = random_params(routed, seed=4, critic=True)
  results = {}
  for config in (routed, dense):
    (_, (logp, logits)), actor_grad = jax.jit(jax.value_and_grad(
        lambda p: _actor_loss_and_logits(config, p, ids, mask), has_aux=True))(actor)
    critic_grad = jax.jit(jax.grad(lambda p: _critic_loss(config, p, ids, mask)))(critic)
    results[config.moe_impl] = (logits, logp, actor_grad, critic_grad)
  real = mask.astype(bool)
  (logits, logp, actor_grad, critic_grad), want = results["routed"], results["dense"]
  _assert_close(np.asarray(logits)[real], np.asarray(want[0])[real])
  _assert_close(np.asarray(logp)[real], np.asarray(want[1])[real])
  _assert_trees_close(actor_grad, want[2], ATOL)
  _assert_trees_close(critic_grad, want[3], ATOL)
  # Several groups were exercised: at least half of the 8 experts got real tokens (17 real tokens × 2 picks).
  expert_grad = np.asarray(actor_grad["model"]["layers_0"]["mlp"]["experts"]["gate_proj"])
  assert np.sum(np.abs(expert_grad).sum(axis=(1, 2)) > 0) >= 4


def _mesh(**axes):
  return Mesh(np.array(jax.devices()[:8]).reshape(tuple(axes.values())), tuple(axes))


@pytest.mark.parametrize("context_mesh", [True, False], ids=["shard_map", "gspmd"])
def test_routed_on_expert_sharded_mesh_equals_dense(context_mesh):
  """Expert weights split 4 ways (2 experts per shard), batch over data × expert; values and gradients = dense."""
  mesh = _mesh(data=2, expert=4)
  routed, dense = _configs("qwen3_5_moe_text", True)
  ids, mask = padded_batch(np.random.default_rng(2), routed.vocab_size, [8, 5, 2, 7, 8, 1, 4, 6], 8)
  params = random_params(routed, seed=5)
  shardings = param_shardings(routed, mesh)
  assert shardings["model"]["layers_0"]["mlp"]["experts"]["down_proj"].spec == P("expert", None, None)
  sharded = jax.device_put(params, shardings)
  data = batch_sharding(mesh)
  sharded_ids, sharded_mask = jax.device_put(ids, data), jax.device_put(mask, data)

  def step(config):
    return jax.jit(jax.value_and_grad(lambda p, i, m: _actor_loss(config, p, i, m), has_aux=True))

  (_, want_logp), want_grad = step(dense)(params, ids, mask)
  if context_mesh:
    with jax.set_mesh(mesh):
      lowered = step(routed).lower(sharded, sharded_ids, sharded_mask)
      (_, logp), grad = step(routed)(sharded, sharded_ids, sharded_mask)
    assert "shard_map" in lowered.as_text() or "sdy.manual_computation" in lowered.as_text()
    assert grad["model"]["layers_1"]["mlp"]["experts"]["up_proj"].sharding.is_equivalent_to(
        NamedSharding(mesh, P("expert", None, None)), 3)
  else:
    (_, logp), grad = step(routed)(sharded, sharded_ids, sharded_mask)
  real = mask.astype(bool)
  _assert_close(np.asarray(logp)[real], np.asarray(want_logp)[real])
  _assert_trees_close(grad, want_grad, ATOL)


def test_expert_count_must_split_over_expert_axis():
  mesh = _mesh(expert=8)
  config = ModelConfig.tiny("qwen3_moe", num_experts=12, num_experts_per_tok=2)
  x = jnp.ones((1, 4, config.hidden_size))
  params = jax.eval_shape(lambda: MoE(config).init(jax.random.PRNGKey(0), x))
  with jax.set_mesh(mesh), pytest.raises(ValueError, match="num_experts: 12 experts"):
    jax.eval_shape(lambda p: MoE(config).apply(p, x), params)


def _moe_flops(num_experts, k, impl, tokens=1024):
  config = ModelConfig.tiny("qwen3_moe", num_experts=num_experts, num_experts_per_tok=k, moe_impl=impl)
  x = jax.ShapeDtypeStruct((1, tokens, config.hidden_size), jnp.float32)
  params = jax.eval_shape(lambda: MoE(config).init(jax.random.PRNGKey(0), jnp.zeros(x.shape)))
  cost = jax.jit(lambda p, x: MoE(config).apply(p, x)).lower(params, x).compile().cost_analysis()
  return (cost[0] if isinstance(cost, list) else cost)["flops"]


def test_flops_grow_with_experts_per_token_not_num_experts():
  routed = {(x, k): _moe_flops(x, k, "routed") for x, k in [(8, 2), (64, 2), (64, 4)]}
  dense = {x: _moe_flops(x, 2, "dense") for x in (8, 64)}
  # Expert matmuls alone: 3 · 2 · tokens · k · hidden · width = 2.5e7 FLOPs at k = 2. Measured: routed 3.9e7 (X = 8),
  # 6.0e7 (X = 64), 1.1e8 (X = 64, k = 4); dense 1.0e8 (X = 8), 8.3e8 (X = 64). The CPU tiles pad each group to a
  # multiple of `tile` rows, a static bound of at most 2× the rows (see moe._tiled_matmul), and the router grows with X.
  assert dense[64] / dense[8] > 6
  assert routed[(64, 2)] / routed[(8, 2)] < 2
  assert 1.5 < routed[(64, 4)] / routed[(64, 2)] < 2.5
  assert routed[(64, 2)] < dense[64] / 8
