"""`ModelConfig.sequence_parallel` (`sao.models.sequence_parallel`): on a mesh with `tensor` > 1 the residual stream
is [B, T, E] with T over `tensor`; the projections keep each chip's tokens, the mixers reach their heads by
all-to-alls and the MoE's shard_map takes the rows already split over `tensor`. The model computes the same
log-probs and gradients as with the hidden units split, and the compiled program saves [N, B / batch shards,
T / tensor, E] per layer where the hidden layout saves [N, B / batch shards, T, E / tensor]."""
import importlib.util
import re

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from sao.models import moe, sequence_parallel
from sao.models.config import ModelConfig
from sao.models.layers import MoE
from sao.models.logprobs import token_logprobs
from sao.models.sharding import batch_sharding, param_shardings
from tests.models.helpers import padded_batch, random_params

# The hybrid (Gated DeltaNet, attention with an output gate, routed experts with a shared expert) over two periods,
# scanned, remat per layer: what the `full` configs run. Rows = the batch shards (one row each, as the `full`
# configs' micro-batches); 128 tokens a row so that `tensor` takes the MoE's tokens (`moe._tokens_over_tensor`).
CONFIG = ModelConfig.tiny("qwen3_5_moe_text", num_layers=4, layer_types=("linear_attention", "full_attention") * 2,
                          remat="full", scan_layers=True)
AXES = dict(fsdp=2, expert=2, tensor=2)
ROWS, LENGTH = 4, 128
# float32 sums in another order (the all-to-alls move whole values; the partial sums over `tensor` of the hidden
# layout are gone), relative to the largest magnitude compared (tests/models/test_moe.py's bounds).
ATOL, GRAD_ATOL = 5e-5, 2.5e-4


def _mesh(**axes):
  return Mesh(np.array(jax.devices()[:8]).reshape(tuple(axes.values())), tuple(axes))


def _constraints(jaxpr) -> list:
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "sharding_constraint":
      found.append(eqn.params["sharding"].spec)
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      found += _constraints(sub)
  return found


@pytest.mark.parametrize("axes", [None, dict(fsdp=8), dict(fsdp=2, tensor=4)])
def test_identity_where_tensor_cannot_split(axes):
  """No mesh; `tensor` of size 1; `tensor` not dividing the dim (T = 3 and 6 heads on a 4-way axis)."""
  x = jnp.ones((2, 3, 6, 4))
  if axes is None:
    assert sequence_parallel.split_tokens(x) is x and sequence_parallel.split_heads(x) is x
    return
  with jax.set_mesh(_mesh(**axes)):
    for fn in (sequence_parallel.split_tokens, sequence_parallel.split_heads):
      assert not _constraints(jax.make_jaxpr(fn)(x).jaxpr)


def test_specs_put_tokens_or_heads_over_tensor():
  x = jnp.ones((4, 8, 4, 2))
  with jax.set_mesh(_mesh(**AXES)):
    assert _constraints(jax.make_jaxpr(sequence_parallel.split_tokens)(x).jaxpr) == [
        jax.sharding.PartitionSpec(("fsdp", "expert"), "tensor", None, None)]
    assert _constraints(jax.make_jaxpr(sequence_parallel.split_heads)(x).jaxpr) == [
        jax.sharding.PartitionSpec(("fsdp", "expert"), None, "tensor", None)]


def _step(config):
  def loss(params, ids, mask):
    logp = token_logprobs(params, config, ids, mask)
    return jnp.sum(jnp.sin(logp) * mask), logp
  return jax.jit(jax.value_and_grad(loss, has_aux=True))


def _close(got, want, atol, what=""):
  scale = float(np.max(np.abs(np.asarray(want)))) + 1e-6
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=atol * scale, err_msg=what)


def test_model_unchanged_and_layer_inputs_split_by_tokens():
  mesh = _mesh(**AXES)
  ids, mask = padded_batch(np.random.default_rng(5), CONFIG.vocab_size, [128, 77, 100, 31], LENGTH)
  params = random_params(CONFIG, seed=6)
  data = batch_sharding(mesh)
  args = (jax.device_put(params, param_shardings(CONFIG, mesh)), jax.device_put(ids, data),
          jax.device_put(mask, data))
  parallel = CONFIG.replace(sequence_parallel=True)
  shards = AXES["fsdp"] * AXES["expert"]
  stack = lambda t, e: rf"f32\[2,{ROWS // shards},{t},{e}\]"  # the scan's saved layer inputs, per device
  with jax.set_mesh(mesh):
    hidden = _step(CONFIG).lower(*args).compile()
    tokens = _step(parallel).lower(*args).compile()
    (_, want), want_grads = hidden(*args)
    (_, got), got_grads = tokens(*args)
  hidden_text, tokens_text = hidden.as_text(), tokens.as_text()
  e, t, tensor = CONFIG.hidden_size, LENGTH, AXES["tensor"]
  assert re.search(stack(t, e // tensor), hidden_text) and not re.search(stack(t // tensor, e), hidden_text)
  assert re.search(stack(t // tensor, e), tokens_text) and not re.search(stack(t, e // tensor), tokens_text)
  assert "all-to-all" in tokens_text  # tokens ↔ heads around the mixers
  real = mask.astype(bool)
  _close(np.asarray(got)[real], np.asarray(want)[real], ATOL)
  assert jax.tree.structure(got_grads) == jax.tree.structure(want_grads)
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got_grads), jax.tree.leaves(want_grads)):
    _close(g, w, GRAD_ATOL, jax.tree_util.keystr(path))


def _shard_maps(jaxpr):
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "shard_map":
      found.append(eqn)
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      found += _shard_maps(sub)
  return found


@pytest.mark.parametrize("length", [128, 16])  # 16: too few rows for whole widths, F stays split over `tensor`
def test_moe_takes_rows_split_over_tensor(length):
  """The MoE's shard_map takes N / (batch shards · tensor) rows and returns them so — with whole expert widths with
  no slice inside, with F split by an all-gather of the rows over `tensor` in and a reduce-scatter out; values and
  gradients equal the dense oracle's."""
  mesh = _mesh(**AXES)
  routed = ModelConfig.tiny("qwen3_5_moe_text", sequence_parallel=True)
  dense = routed.replace(moe_impl="dense", sequence_parallel=False)
  x = jax.random.normal(jax.random.PRNGKey(3), (4, length, routed.hidden_size))
  params = MoE(routed).init(jax.random.PRNGKey(0), x)["params"]
  whole = moe._tokens_over_tensor(mesh, ("fsdp", "expert"), 4 * length, routed.num_experts_per_tok,
                                  routed.num_experts, routed.moe_intermediate_size)
  assert whole == (length == 128)

  def value_and_grad(config):
    loss = lambda p, x: jnp.sum(jnp.sin(MoE(config).apply({"params": p}, x)))
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

  want, want_grads = value_and_grad(dense)(params, x)
  with jax.set_mesh(mesh):
    x_split = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("fsdp", "expert"),
                                                                                            "tensor")))
    mapped = _shard_maps(jax.make_jaxpr(value_and_grad(routed))(params, x_split).jaxpr)
    got, got_grads = value_and_grad(routed)(params, x_split)
  body = mapped[0].params["jaxpr"]
  assert body.invars[0].aval.shape == (4 * length // 8, routed.hidden_size)
  rows = jax.sharding.PartitionSpec(("fsdp", "expert", "tensor"))
  assert mapped[0].params["in_specs"][0] == rows and mapped[0].params["out_specs"][0] == rows
  primitives = {e.primitive.name for e in body.eqns}
  if whole:
    assert "dynamic_slice" not in primitives
  else:
    assert "reduce_scatter" in primitives or "psum_scatter" in primitives, primitives
  _close(got, want, ATOL)
  for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
    _close(g, w, GRAD_ATOL)


def _logprob_step(chunk_size: int, sequence_parallel: bool):
  from sao.models.logprobs import logprobs_from_hidden  # pylint: disable=g-import-not-at-top

  def loss(hidden, unembed, ids, mask):
    lp, ent = logprobs_from_hidden(hidden, unembed, ids, mask, chunk_size=chunk_size, return_entropy=True,
                                   sequence_parallel=sequence_parallel)
    return jnp.sum(jnp.sin(lp) + ent), (lp, ent)
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


@pytest.mark.parametrize("length", [64, 40])  # 40: 2 × 8 does not divide 40 − the loop walks one part
def test_logprobs_score_each_chips_tokens_exactly(length):
  """hidden [B, T, E] with T over `tensor`: the log-probs, entropies and both gradients equal the meshless ones."""
  keys = jax.random.split(jax.random.PRNGKey(1), 3)
  hidden = jax.random.normal(keys[0], (4, length, 16), jnp.float32)
  unembed = jax.random.normal(keys[1], (64, 16), jnp.float32) * 0.3
  ids = jax.random.randint(keys[2], (4, length), 0, 64)
  mask = jnp.asarray(np.arange(length)[None, :] >= np.array([0, 3, 9, 30])[:, None], jnp.int32)
  expected = _logprob_step(8, False)(hidden, unembed, ids, mask)
  mesh = _mesh(**AXES)
  with jax.set_mesh(mesh):
    split = jax.device_put(hidden, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("fsdp", "expert"),
                                                                                              "tensor")))
    got = _logprob_step(8, True)(split, unembed, ids, mask)
  for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(got)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5)


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed")
def test_logprob_loop_moves_no_tokens_between_chips():
  """On a compiled v5p:2x2x1 program (fsdp 2 × tensor 2) with the tokens over `tensor`, no collective runs inside
  the chunk loop (forward or backward): each chip scores its own chunks (a dynamic index into a dim split over
  `tensor` made XLA gather the whole hidden state once per chunk)."""
  from sao.aot import hlo_cost, hlo_text, tpu_topology  # pylint: disable=g-import-not-at-top
  chip, devices = tpu_topology.topology_devices("v5p:2x2x1")
  mesh = Mesh(np.array(devices).reshape(2, 2), ("fsdp", "tensor"))
  b, t, e, v = 2, 2048, 256, 4096
  spec = lambda *s: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*s))
  args = (jax.ShapeDtypeStruct((b, t, e), "bfloat16", sharding=spec("fsdp", "tensor")),
          jax.ShapeDtypeStruct((v, e), "bfloat16", sharding=spec("tensor", "fsdp")),
          jax.ShapeDtypeStruct((b, t), "int32", sharding=spec("fsdp")),
          jax.ShapeDtypeStruct((b, t), "int32", sharding=spec("fsdp")))
  with jax.set_mesh(mesh):
    compiled = _logprob_step(256, True).lower(*args).compile()
  ops = hlo_cost.breakdown(hlo_text.parse_module(compiled.as_text()), chip).ops
  in_loop = [(o.name, o.shape, o.count) for o in ops if o.kind == "collective" and o.count > 1]
  assert in_loop == []
