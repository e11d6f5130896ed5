"""Routed, dropless MoE (`sao.models.moe`) = the dense oracle: grouped matmuls, full models (logits, log-probs,
actor and critic gradients, padding), an expert-sharded mesh of the 8 fake devices, and XLA's FLOP count."""
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

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
# Gradients sum more terms (the embedding's row of a token that occurs often reaches ~700): measured 5.4e-5 of that
# largest magnitude on a CI machine's CPU (one element of 8,192, every sharded mesh), 1.7e-5 on another. A routing
# or weighting bug moves gradients by O(1) of their scale, far above this.
GRAD_ATOL = 2.5e-4


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


def _assert_trees_close(got, want, atol=GRAD_ATOL):
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
  _assert_trees_close(actor_grad, want[2])
  _assert_trees_close(critic_grad, want[3])
  # Several groups were exercised: at least half of the 8 experts got real tokens (17 real tokens × 2 picks).
  expert_grad = np.asarray(actor_grad["model"]["layers_0"]["mlp"]["experts"]["gate_proj"])
  assert np.sum(np.abs(expert_grad).sum(axis=(1, 2)) > 0) >= 4


def _mesh(**axes):
  return Mesh(np.array(jax.devices()[:8]).reshape(tuple(axes.values())), tuple(axes))


# Meshes of the 8 fake devices: tokens over the batch axes alone, with the expert axis, and with expert and
# tensor-split expert widths together. "gspmd": no context mesh (GSPMD partitions the one-device formulation).
MESHES = {"fsdp": dict(fsdp=8), "data_expert": dict(data=2, expert=4),
          "fsdp_expert_tensor": dict(fsdp=2, expert=2, tensor=2)}


def _shard_map_eqns(jaxpr):
  """Every shard_map equation in a closed jaxpr, nested ones included."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "shard_map":
      found.append(eqn)
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      found += _shard_map_eqns(sub)
  return found


@pytest.mark.parametrize("mesh_axes, context_mesh",
                         [(axes, True) for axes in MESHES] + [("data_expert", False)],
                         ids=[f"{axes}-set_mesh" for axes in MESHES] + ["data_expert-gspmd"])
def test_routed_on_sharded_mesh_equals_dense(mesh_axes, context_mesh):
  """Values and gradients = dense with the batch over the mesh's batch axes and, where present, the experts over
  `expert` (4 shards: 2 experts each) and expert widths over `tensor`. Under `jax.set_mesh` the experts run in a
  shard_map where each shard routes only its own tokens: the sorted token copies are N / batch shards rows."""
  mesh = _mesh(**MESHES[mesh_axes])
  routed, dense = _configs("qwen3_5_moe_text", True)
  ids, mask = padded_batch(np.random.default_rng(2), routed.vocab_size, [8, 5, 2, 7, 8, 1, 4, 6], 8)
  params = random_params(routed, seed=5)
  shardings = param_shardings(routed, mesh)
  if "expert" in mesh.shape:
    assert shardings["model"]["layers_0"]["mlp"]["experts"]["down_proj"].spec[0] == "expert"
  sharded = jax.device_put(params, shardings)
  data = batch_sharding(mesh)
  sharded_ids, sharded_mask = jax.device_put(ids, data), jax.device_put(mask, data)

  def step(config):
    return jax.jit(jax.value_and_grad(lambda p, i, m: _actor_loss(config, p, i, m), has_aux=True))

  (_, want_logp), want_grad = step(dense)(params, ids, mask)
  if context_mesh:
    with jax.set_mesh(mesh):
      jaxpr = jax.make_jaxpr(step(routed))(sharded, sharded_ids, sharded_mask)
      (_, logp), grad = step(routed)(sharded, sharded_ids, sharded_mask)
    batch_shards = int(np.prod([mesh.shape[a] for a in moe.BATCH_AXES if a in mesh.shape]))
    mapped = _shard_map_eqns(jaxpr.jaxpr)
    assert mapped, "no shard_map under the context mesh"
    tokens = ids.size  # B·T rows reach each MoE block
    for eqn in mapped:  # x, the first operand, arrives as this shard's rows only
      assert eqn.params["jaxpr"].invars[0].aval.shape == (tokens // batch_shards, routed.hidden_size)
  else:
    (_, logp), grad = step(routed)(sharded, sharded_ids, sharded_mask)
  real = mask.astype(bool)
  _assert_close(np.asarray(logp)[real], np.asarray(want_logp)[real])
  _assert_trees_close(grad, want_grad)


def test_tokens_the_batch_shards_do_not_divide_stay_replicated():
  """5 tokens on an 8-way batch-sharded mesh with experts over `expert`: every shard computes all tokens (the
  expert partial sums added over `expert`), = the dense oracle."""
  mesh = _mesh(fsdp=2, expert=2, tensor=2)
  routed, dense = _configs("qwen3_moe", True)
  x = jax.random.normal(jax.random.PRNGKey(1), (1, 5, routed.hidden_size))
  params = MoE(routed).init(jax.random.PRNGKey(0), x)
  want = MoE(dense).apply(params, x)
  with jax.set_mesh(mesh):
    got = jax.jit(lambda p, x: MoE(routed).apply(p, x))(params, x)
  _assert_close(got, want)


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


@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen3_5_moe_text"])
def test_long_micro_batches_split_tokens_over_tensor(model_type):
  """With many tokens per shard (8 × 48 here: 192 gathered tokens × top-2 = 384 sorted rows per expert group against
  3 × 4 × 32 = 384 rows of expert weights, so 8 × 128 tips it) `tensor` takes tokens, not expert widths: each `tensor` shard runs half of
  the N / batch shards rows it holds, the expert weights gathered whole inside the shard_map and the output gathered
  over `tensor` at its end; values and gradients still equal dense. qwen3_5_moe_text's shared expert runs inside the
  same shard_map on the same half of the rows (its four weights enter whole)."""
  mesh = _mesh(fsdp=2, expert=2, tensor=2)
  routed, dense = _configs(model_type, True)
  x = jax.random.normal(jax.random.PRNGKey(3), (8, 128, routed.hidden_size))
  params = MoE(routed).init(jax.random.PRNGKey(0), x)["params"]
  k, experts, width = routed.num_experts_per_tok, routed.num_experts, routed.moe_intermediate_size
  assert moe._tokens_over_tensor(mesh, ("fsdp", "expert"), 8 * 128, k, experts, width)
  assert not moe._tokens_over_tensor(mesh, ("fsdp", "expert"), 8 * 48, k, experts, width)

  def value_and_grad(config):
    loss = lambda p, x: jnp.sum(jnp.sin(MoE(config).apply({"params": p}, x)))
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

  want, want_grads = value_and_grad(dense)(params, x)
  with jax.set_mesh(mesh):
    mapped = _shard_map_eqns(jax.make_jaxpr(value_and_grad(routed))(params, x).jaxpr)
    got, got_grads = value_and_grad(routed)(params, x)
  inputs = mapped[0].params["jaxpr"].invars
  assert len(inputs) == (10 if routed.shared_expert_intermediate_size else 6)
  assert inputs[0].aval.shape == (8 * 128 // 4, routed.hidden_size)  # 4 batch shards; halved over tensor inside
  # w_gate enters as stored (experts over `expert`, F over `tensor`, D over `fsdp`) and is gathered whole inside.
  assert inputs[3].aval.shape == (routed.num_experts // 2, routed.moe_intermediate_size // 2, routed.hidden_size // 2)
  gathered = [e for e in mapped[0].params["jaxpr"].eqns if e.primitive.name == "all_gather"]
  assert {e.params["axis_name"] for e in gathered} >= {("tensor",), ("fsdp",), ("expert",)}, gathered
  _assert_close(got, want)
  _assert_trees_close(got_grads, want_grads)
