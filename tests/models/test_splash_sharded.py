"""Splash attention under `shard_map` (`sao.models.splash_attention.sharded_splash_attention`): the kernel run per
device through the Pallas interpreter on a fake 8-device CPU mesh equals the reference (values and gradients); the
layout it picks; and "auto" selecting it for a TPU program on a multi-chip mesh, compiled ahead of time (libtpu)."""
from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec as P

from sao.models import attention as attn
from sao.models import splash_attention as sa

pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention")
needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed")
AXES = ("data", "fsdp", "expert", "tensor")
ATOL = 2e-5


def _cpu_mesh(fsdp: int, tensor: int) -> Mesh:
  devices = jax.devices()
  if len(devices) < fsdp * tensor:
    pytest.skip(f"needs {fsdp * tensor} CPU devices")
  return Mesh(np.array(devices[:fsdp * tensor]).reshape(1, fsdp, 1, tensor), AXES)


@pytest.mark.parametrize("batch,heads,kv_heads,fsdp,tensor", [
    (2, 8, 2, 2, 4),  # GQA, tensor (4) does not divide the KV heads (2): each KV head repeated twice, rows over fsdp
    (1, 6, 2, 2, 4),  # tensor divides neither the heads nor the batch: every device runs the whole problem
])
def test_sharded_splash_equals_reference_on_a_cpu_mesh(batch, heads, kv_heads, fsdp, tensor):
  """Per-device kernels in interpret mode under a (data 1, fsdp, expert 1, tensor) mesh of CPU devices: outputs and
  q/k/v gradients equal the float32 reference on every real query, rows left- and right-padded. (A padding query
  sees only padding keys in splash: its output is unspecified, and callers give it no weight.)"""
  t, d = 128, 128
  rng = np.random.default_rng(batch * 100 + heads)
  q = jnp.asarray(rng.normal(size=(batch, t, heads, d)), jnp.float32)
  k, v = (jnp.asarray(rng.normal(size=(batch, t, kv_heads, d)), jnp.float32) for _ in range(2))
  valid = np.ones((batch, t), bool)
  valid[0, :5] = False  # left padding
  valid[-1, t - 11:] = False  # right padding (the same row when batch = 1)
  mask = attn.AttentionMask(jnp.asarray(valid))
  real = (np.asarray(mask.dense(t).any(-1)) & valid)[:, :, None, None]
  weights = jnp.asarray(rng.normal(size=q.shape), jnp.float32) * real

  def out_and_grads(fn):
    def run(q, k, v):
      out, pullback = jax.vjp(fn, q, k, v)
      return out, pullback(weights)
    return jax.jit(run)(q, k, v)

  want, want_grads = out_and_grads(lambda q, k, v: attn.reference_attention(q, k, v, mask.dense(t)))
  with jax.set_mesh(_cpu_mesh(fsdp, tensor)):
    got, got_grads = out_and_grads(lambda q, k, v: sa.sharded_splash_attention(q, k, v, mask.key_valid, block=128,
                                                                               interpret=True))
  np.testing.assert_allclose(np.where(real, got, 0), np.where(real, want, 0), atol=ATOL)
  for name, g, w in zip("qkv", got_grads, want_grads):
    np.testing.assert_allclose(g, w, atol=ATOL, err_msg=f"d{name}")


def test_splash_layout():
  """Rows over the batch axes that divide B, heads over `tensor` when it divides H, KV heads repeated to
  lcm(K, tensor) when it does not divide K; manual axes left alone."""
  pod = AbstractMesh((1, 4, 1, 16), AXES)  # the v5p-128 layout of the `full` configs: fsdp 4 × tensor 16
  assert sa.splash_layout(pod, 8, 16, 2) == (P(("data", "fsdp", "expert"), None, "tensor", None),
                                             P(("data", "fsdp", "expert"), None, "tensor", None),
                                             P(("data", "fsdp", "expert"), None), 8)
  assert sa.splash_layout(pod, 2, 32, 16)[1:] == (P("data", None, "tensor", None), P("data", None), 1)
  assert sa.splash_layout(pod, 4, 24, 8)[0] == P(("data", "fsdp", "expert"), None, None, None)  # 16 ∤ 24 heads
  inner = AbstractMesh((2, 4), ("fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Manual,
                                                               jax.sharding.AxisType.Auto))
  assert sa.splash_layout(inner, 8, 8, 2) == (P(None, None, "tensor", None), P(None, None, "tensor", None),
                                              P(None, None), 2)


def test_auto_picks_splash_for_a_tpu_program_on_any_known_mesh():
  assert attn.resolve_impl("auto", 4096, 4096, cached=False, backend="tpu", num_devices=128) == "splash"
  assert attn.resolve_impl("auto", 4096, 4096, cached=False, backend="tpu", num_devices=0) == "blockwise"
  longest = attn.SPLASH_MAX_LENGTH
  assert attn.resolve_impl("auto", longest, longest, cached=False, backend="tpu", num_devices=128) == "splash"
  assert attn.resolve_impl("auto", 2 * longest, 2 * longest, cached=False, backend="tpu", num_devices=8) == "blockwise"
  assert attn.resolve_impl("auto", 4096, 4096, cached=False, backend="cpu", num_devices=128) == "blockwise"
  q = jax.ShapeDtypeStruct((8, 4096, 16, 128), jnp.bfloat16)
  k = jax.ShapeDtypeStruct((8, 4096, 2, 128), jnp.bfloat16)
  with jax.sharding.use_abstract_mesh(AbstractMesh((1, 4, 1, 16), AXES)):  # devices unknown: a TPU program may be
    assert attn.platform_impls("auto", q, k, cached=False)["tpu"] == "splash"
  with jax.set_mesh(_cpu_mesh(2, 4)):  # CPU devices: no TPU branch is traced
    assert set(attn.platform_impls("auto", q, k, cached=False).values()) == {"blockwise"}


@needs_libtpu
def test_auto_compiles_sharded_splash_for_a_multi_chip_tpu_mesh():
  """value_and_grad of "auto" attention under a v5p:2x2x1 mesh (fsdp 2 × tensor 2; H = 4, K = 1, so each KV head is
  repeated twice), compiled ahead of time: the program runs splash's forward, dq and dkv kernels on each chip's
  block (q [G = 2, T, D]: one row, two heads), priced by `hlo_cost` (no unknown custom call), and the only
  collective carrying attention data is the KV gradients' sum over the two copies, once."""
  from sao.aot import hlo_cost, hlo_text, tpu_topology  # pylint: disable=g-import-not-at-top
  chip, devices = tpu_topology.topology_devices("v5p:2x2x1")
  mesh = Mesh(np.array(devices).reshape(1, 2, 1, 2), AXES)
  b, t, h, kv, d = 2, 1024, 4, 1, 128
  q = jax.ShapeDtypeStruct((b, t, h, d), "bfloat16", sharding=NamedSharding(mesh, P("fsdp", None, "tensor")))
  k = jax.ShapeDtypeStruct((b, t, kv, d), "bfloat16", sharding=NamedSharding(mesh, P("fsdp")))
  valid = jax.ShapeDtypeStruct((b, t), "bool", sharding=NamedSharding(mesh, P("fsdp")))
  loss = lambda q, k, v, valid: jnp.sum(attn.attention(q, k, v, attn.AttentionMask(valid)).astype(jnp.float32) ** 2)
  with jax.set_mesh(mesh):
    assert attn.platform_impls("auto", q, k, cached=False)["tpu"] == "splash"
    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(q, k, k, valid).compile()
  result = hlo_cost.breakdown(hlo_text.parse_module(compiled.as_text()), chip)
  assert not result.unknown_custom_calls
  kernels = {o.detail.split("_segmented")[0]: o for o in result.ops if o.kind == "custom-call"}
  assert sorted(kernels) == ["splash_mqa_dkv", "splash_mqa_dq", "splash_mqa_fwd"]
  unit = 2 * t * t * d * 3 / 4  # G·T query rows × S keys × D, 3 of the 2 × 2 tiles of 512 causally visible
  assert [kernels[n].flops for n in ("splash_mqa_fwd", "splash_mqa_dq", "splash_mqa_dkv")] == [4 * unit, 6 * unit,
                                                                                              8 * unit]
  moved = [o for o in result.ops if o.kind == "collective" and o.bytes > 8]
  assert [(o.opcode, o.shape, o.count) for o in moved] == [
      ("all-reduce", "bf16[1,1024,1,128], bf16[1,1024,1,128]", 1.0)]
