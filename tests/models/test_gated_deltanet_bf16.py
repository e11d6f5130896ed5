"""Gated DeltaNet's chunked form with bf16 matmul operands (`ModelConfig.linear_attn_matmul="bfloat16"`, as
flash-linear-attention computes it) against the float64 loop and the f32 form: outputs, final state and gradients
within bf16's relative error, the state kept f32, and the scan's stored chunk inputs really bf16."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao.models.config import ModelConfig
from sao.models.gated_deltanet import GatedDeltaNet, chunked_gated_delta_rule, recurrent_gated_delta_rule
from tests.models.test_gated_deltanet import _random_rule_inputs, _reference_rule

relative = lambda got, want: float(np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want))


def test_bf16_matmuls_match_float64_within_bf16_error():
  rng = np.random.default_rng(3)
  mask, q, k, v, g, beta, state = _random_rule_inputs(rng, b=2, t=150, h=2, dk=32, dv=32)
  want_out, want_state = _reference_rule(q, k, v, g, beta, state)
  args = tuple(jnp.asarray(x, jnp.float32) for x in (q, k, v, g, beta, state))
  run = jax.jit(chunked_gated_delta_rule, static_argnames=("chunk_size", "matmul_dtype"))
  errors = {}
  for dtype in (jnp.float32, jnp.bfloat16):
    out, s = run(*args, chunk_size=64, matmul_dtype=dtype)
    assert out.dtype == s.dtype == jnp.float32
    errors[dtype] = (relative(np.asarray(out)[mask], want_out[mask]), relative(s, want_state))
  assert max(errors[jnp.float32]) < 1e-5, errors
  assert max(errors[jnp.bfloat16]) < 2e-2, errors  # bf16 has 8 mantissa bits: ≈ 4e-3 per rounding
  assert min(errors[jnp.bfloat16]) > 10 * max(errors[jnp.float32])  # the bf16 path really rounds


def test_bf16_gradients_match_the_f32_recurrence():
  rng = np.random.default_rng(11)
  _, q, k, v, g, beta, state = _random_rule_inputs(rng, b=2, t=70, h=2, dk=16, dv=16)
  args = tuple(jnp.asarray(x, jnp.float32) for x in (q, k, v, g, beta, state))
  weights = jnp.asarray(rng.standard_normal(v.shape), jnp.float32)

  def loss(fn, *a):
    out, s = fn(*a)
    return jnp.sum(out * weights) + jnp.sum(s ** 2)

  bf16 = lambda *a: chunked_gated_delta_rule(*a, chunk_size=32, matmul_dtype=jnp.bfloat16)
  want = jax.jit(jax.grad(lambda *a: loss(recurrent_gated_delta_rule, *a), argnums=tuple(range(6))))(*args)
  got = jax.jit(jax.grad(lambda *a: loss(bf16, *a), argnums=tuple(range(6))))(*args)
  for name, a, b in zip("q k v g beta state".split(), want, got):
    assert relative(b, np.asarray(a, np.float64)) < 3e-2, name


def test_the_scan_reads_bf16_chunks_and_carries_an_f32_state():
  args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in ((1, 128, 2, 16),) * 3 + ((1, 128, 2),) * 2]
  jaxpr = jax.make_jaxpr(lambda *a: chunked_gated_delta_rule(*a, chunk_size=32, matmul_dtype=jnp.bfloat16))(*args)
  (scan,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]
  carry = scan.invars[scan.params["num_consts"]:][:scan.params["num_carry"]]
  xs = scan.invars[scan.params["num_consts"] + scan.params["num_carry"]:]
  assert [v.aval.dtype for v in carry] == [jnp.float32]
  assert sorted(str(v.aval.dtype) for v in xs) == ["bfloat16"] * 5 + ["float32"]  # u, w, attn, q, k; chunk decay


def test_the_block_follows_the_config_and_rejects_an_unknown_precision():
  cfg = ModelConfig.tiny("qwen3_next")
  x = jax.random.normal(jax.random.key(0), (2, 24, cfg.hidden_size))
  mask = jnp.ones((2, 24), jnp.int32).at[0, :5].set(0)
  params = GatedDeltaNet(cfg).init(jax.random.key(1), x, mask, None)
  f32 = GatedDeltaNet(cfg).apply(params, x, mask, None)[0]
  bf16 = GatedDeltaNet(dataclasses.replace(cfg, linear_attn_matmul="bfloat16")).apply(params, x, mask, None)[0]
  assert relative(bf16, np.asarray(f32, np.float64)) < 2e-2 and not np.allclose(bf16, f32, atol=0, rtol=1e-6)
  with pytest.raises(ValueError, match="linear_attn_matmul"):
    dataclasses.replace(cfg, linear_attn_matmul="float16")
