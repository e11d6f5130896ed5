"""Collectives kept out of the time loops (issue 19, lever 1), checked on a compiled v5p:2x2x1 (4 chips) program
with `sao.aot.hlo_cost`: each executed instruction carries its count, the product of the trip counts of the loops
around it, so an all-reduce inside a block loop has count > 1.

- Blockwise attention with fewer KV heads than `tensor` chips: the KV gradient is summed over the chips sharing a KV
  head once (`attention.replicate_kv_heads`), not once per key block × query block.

And the CPU checks of the same helpers (exact numerics, the repeat count), which need no libtpu.
"""
from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sao.models import attention as attn

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed")


def _tpu_mesh(fsdp: int, tensor: int):
  from sao.aot import tpu_topology  # pylint: disable=g-import-not-at-top
  chip, devices = tpu_topology.topology_devices("v5p:2x2x1")
  return chip, Mesh(np.array(devices).reshape(fsdp, tensor), ("fsdp", "tensor"))


def _loop_collectives(compiled, chip, opcode: str) -> list:
  from sao.aot import hlo_cost, hlo_text  # pylint: disable=g-import-not-at-top
  result = hlo_cost.breakdown(hlo_text.parse_module(compiled.as_text()), chip)
  assert not result.unknown_trip_counts
  return [o for o in result.ops if o.opcode.startswith(opcode) and o.count > 1]


def test_kv_repeats():
  assert attn.kv_repeats(16, 2, 16) == 8  # Qwen3.5 over tensor = 16: every chip its own copy
  assert attn.kv_repeats(32, 4, 8) == 2
  assert attn.kv_repeats(8, 2, 4) == 2
  assert attn.kv_repeats(16, 4, 4) == 1  # tensor divides the KV heads: each chip owns whole heads
  assert attn.kv_repeats(16, 2, 1) == 1
  assert attn.kv_repeats(6, 2, 4) == 1  # query heads not split over tensor either


def test_replicated_kv_heads_are_exact_on_a_cpu_mesh():
  """Under a mesh with tensor = 2 > K = 1 blockwise attention repeats K/V; output and gradients equal the meshless
  ones (a repeat and its transpose, a sum of one term per copy: exact)."""
  devices = jax.devices()
  if len(devices) < 2:
    pytest.skip("needs 2 CPU devices")
  mesh = Mesh(np.array(devices[:2]).reshape(1, 2), ("fsdp", "tensor"))
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  q = jax.random.normal(keys[0], (1, 64, 2, 8), jnp.float32)
  k, v = (jax.random.normal(key, (1, 64, 1, 8), jnp.float32) for key in keys[1:])
  mask = attn.AttentionMask(jnp.ones((1, 64), bool))
  loss = lambda q, k, v: jnp.sum(jnp.sin(attn.blockwise_attention(q, k, v, mask, block_q=16, block_k=16)))
  step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
  expected = step(q, k, v)
  with jax.set_mesh(mesh):
    assert attn.replicate_kv_heads(k, v, 2)[0].shape == (1, 64, 2, 8)
    got = step(q, k, v)
  for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(got)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


@needs_libtpu
def test_kv_gradient_is_not_reduced_inside_the_block_loop():
  """H = 8 query heads, K = 2 KV heads over tensor = 4, 4 × 4 blocks: no all-reduce runs more than once."""
  chip, mesh = _tpu_mesh(1, 4)
  b, t, h, kv, d = 2, 1024, 8, 2, 128
  q = jax.ShapeDtypeStruct((b, t, h, d), "bfloat16", sharding=NamedSharding(mesh, P(None, None, "tensor")))
  k = jax.ShapeDtypeStruct((b, t, kv, d), "bfloat16", sharding=NamedSharding(mesh, P()))
  mask = attn.AttentionMask(jnp.ones((b, t), bool))
  loss = lambda q, k, v: jnp.sum(attn.blockwise_attention(q, k, v, mask, block_q=256, block_k=256)
                                 .astype(jnp.float32) ** 2)
  with jax.set_mesh(mesh):
    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(q, k, k).compile()
  assert _loop_collectives(compiled, chip, "all-reduce") == []


def _unembedding_loss(chunk_size: int):
  from sao.models.logprobs import logprobs_from_hidden  # pylint: disable=g-import-not-at-top
  def loss(hidden, unembed, ids):
    return jnp.sum(logprobs_from_hidden(hidden, unembed, ids, chunk_size=chunk_size))
  return jax.value_and_grad(loss, argnums=(0, 1))


def test_gathered_unembedding_is_exact_on_a_cpu_mesh():
  """Under a mesh with fsdp = 2 × tensor = 2 the log-probs and both gradients equal the meshless ones."""
  devices = jax.devices()
  if len(devices) < 4:
    pytest.skip("needs 4 CPU devices")
  mesh = Mesh(np.array(devices[:4]).reshape(2, 2), ("fsdp", "tensor"))
  keys = jax.random.split(jax.random.PRNGKey(1), 3)
  hidden = jax.random.normal(keys[0], (2, 40, 16), jnp.float32)
  unembed = jax.random.normal(keys[1], (64, 16), jnp.float32) * 0.3
  ids = jax.random.randint(keys[2], (2, 40), 0, 64)
  step = jax.jit(_unembedding_loss(chunk_size=8))
  expected = step(hidden, unembed, ids)
  with jax.set_mesh(mesh):
    sharded = jax.device_put(unembed, NamedSharding(mesh, P("tensor", "fsdp")))
    got = step(jax.device_put(hidden, NamedSharding(mesh, P("fsdp", None, "tensor"))), sharded, ids)
  for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(got)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5)


@needs_libtpu
def test_unembedding_is_gathered_once_not_per_chunk():
  """The [V, E] unembedding with E over `fsdp` (its parameter layout): the chunked log-probs gather it before the
  time loop (`logprobs.gather_unembedding`), so no all-gather of it runs once per chunk, forward or backward."""
  chip, mesh = _tpu_mesh(2, 2)
  b, t, e, v = 4, 1024, 256, 4096
  hidden = jax.ShapeDtypeStruct((b, t, e), "bfloat16", sharding=NamedSharding(mesh, P("fsdp", None, "tensor")))
  unembed = jax.ShapeDtypeStruct((v, e), "bfloat16", sharding=NamedSharding(mesh, P("tensor", "fsdp")))
  ids = jax.ShapeDtypeStruct((b, t), "int32", sharding=NamedSharding(mesh, P("fsdp")))
  with jax.set_mesh(mesh):
    compiled = jax.jit(_unembedding_loss(chunk_size=128)).lower(hidden, unembed, ids).compile()
  in_loop = [o for o in _loop_collectives(compiled, chip, "all-gather") if f"[{v // 2},{e}]" in o.shape]
  assert in_loop == [], [(o.name, o.shape, o.count) for o in in_loop]
