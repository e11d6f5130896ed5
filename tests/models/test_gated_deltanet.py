"""Gated DeltaNet kernels against float64 numpy references, with random padding masks: recurrent form, chunked form
(lengths not a multiple of the chunk), their gradients, and the padding-skipping causal conv."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao.models.gated_deltanet import (causal_conv1d, chunked_gated_delta_rule, recurrent_gated_delta_rule,
                                       solve_unit_lower)


def _random_rule_inputs(rng, b=3, t=13, h=2, dk=8, dv=4):
  """q, k unit vectors (q scaled by dk^-1/2), v, g <= 0, β in (0, 1), initial state; padding tokens get g = β = 0
  and q = k = v = 0 (what the block feeds the kernel), at random positions (not only left/right)."""
  mask = rng.random((b, t)) < 0.7
  mask[:, -1] = True
  q = rng.standard_normal((b, t, h, dk))
  k = rng.standard_normal((b, t, h, dk))
  q = q / np.linalg.norm(q, axis=-1, keepdims=True) / np.sqrt(dk)
  k = k / np.linalg.norm(k, axis=-1, keepdims=True)
  v = rng.standard_normal((b, t, h, dv))
  g = -rng.uniform(0.0, 1.5, (b, t, h))
  beta = rng.uniform(0.05, 0.95, (b, t, h))
  m = mask[..., None]
  q, k, v = q * m[..., None], k * m[..., None], v * m[..., None]
  g, beta = g * m, beta * m
  state = rng.standard_normal((b, h, dk, dv))
  return mask, q, k, v, g, beta, state


def _reference_rule(q, k, v, g, beta, state):
  """float64 loop: S = e^g (I − β k kᵀ) S + β k vᵀ; o = Sᵀ q."""
  b, t, h, dk = k.shape
  out = np.zeros(v.shape)
  s = state.astype(np.float64).copy()
  for bi in range(b):
    for hi in range(h):
      for ti in range(t):
        kt = k[bi, ti, hi][:, None]
        s[bi, hi] = np.exp(g[bi, ti, hi]) * (np.eye(dk) - beta[bi, ti, hi] * kt @ kt.T) @ s[bi, hi]
        s[bi, hi] += beta[bi, ti, hi] * kt @ v[bi, ti, hi][None, :]
        out[bi, ti, hi] = s[bi, hi].T @ q[bi, ti, hi]
  return out, s


@pytest.mark.parametrize("chunk_size", [5, 64])  # 13 tokens: 3 chunks with a padded tail; one chunk
def test_chunked_and_recurrent_match_float64_reference(chunk_size):
  rng = np.random.default_rng(chunk_size)
  mask, q, k, v, g, beta, state = _random_rule_inputs(rng)
  want_out, want_state = _reference_rule(q, k, v, g, beta, state)
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  args = tuple(f32(x) for x in (q, k, v, g, beta, state))
  rec_out, rec_state = jax.jit(recurrent_gated_delta_rule)(*args)
  chunk_out, chunk_state = jax.jit(chunked_gated_delta_rule, static_argnames="chunk_size")(
      *args, chunk_size=chunk_size)
  for out, s in ((rec_out, rec_state), (chunk_out, chunk_state)):
    np.testing.assert_allclose(np.asarray(out)[mask], want_out[mask], atol=2e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(s), want_state, atol=2e-5, rtol=0)
  # Padding tokens are exact no-ops: the same rows with them removed give the same state and real outputs.
  for b in range(mask.shape[0]):
    keep = mask[b]
    out_b, s_b = _reference_rule(*(x[b:b + 1, keep] for x in (q, k, v, g, beta)), state[b:b + 1])
    np.testing.assert_allclose(out_b[0], want_out[b, keep], atol=1e-12)
    np.testing.assert_allclose(s_b[0], want_state[b], atol=1e-12)


def test_chunked_gradients_equal_recurrent_gradients():
  rng = np.random.default_rng(7)
  _, q, k, v, g, beta, state = _random_rule_inputs(rng, b=2, t=11)
  args = tuple(jnp.asarray(x, jnp.float32) for x in (q, k, v, g, beta, state))
  weights = jnp.asarray(rng.standard_normal(v.shape), jnp.float32)

  def loss(fn, *a):
    out, s = fn(*a)
    return jnp.sum(out * weights) + jnp.sum(s ** 2)

  chunked = lambda *a: chunked_gated_delta_rule(*a, chunk_size=4)
  g_rec = jax.jit(jax.grad(lambda *a: loss(recurrent_gated_delta_rule, *a), argnums=tuple(range(6))))(*args)
  g_chunk = jax.jit(jax.grad(lambda *a: loss(chunked, *a), argnums=tuple(range(6))))(*args)
  for a, b in zip(g_rec, g_chunk):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-4, rtol=1e-4)


def _reference_conv(x, weight, mask, state):
  """float64: per row, convolve the real tokens (preceded by the state) and scatter back; new state = last K − 1."""
  k = weight.shape[0]
  y = np.zeros(x.shape)
  new_state = np.zeros(state.shape)
  for b in range(x.shape[0]):
    seq = np.concatenate([state[b], x[b][mask[b]]], axis=0)
    conv = np.array([sum(weight[j] * seq[i + j] for j in range(k)) for i in range(len(seq) - k + 1)])
    if mask[b].any():
      y[b][mask[b]] = conv / (1 + np.exp(-conv))
    new_state[b] = seq[-(k - 1):]
  return y, new_state


def test_causal_conv_skips_padding_anywhere_and_carries_state():
  rng = np.random.default_rng(3)
  b, t, c, k = 4, 9, 6, 4
  x = rng.standard_normal((b, t, c))
  weight = rng.standard_normal((k, c))
  state = rng.standard_normal((b, k - 1, c))
  mask = rng.random((b, t)) < 0.6
  mask[0] = True  # no padding
  mask[1] = False  # all padding: the state passes through unchanged
  mask[2, :2] = False  # left padding with one real token...
  mask[2, 2:] = [True] + [False] * (t - 3)
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  y, new_state = jax.jit(causal_conv1d)(f32(x), f32(weight), jnp.asarray(mask), f32(state))
  want_y, want_state = _reference_conv(x, weight, mask, state)
  np.testing.assert_allclose(np.asarray(y), want_y, atol=1e-5, rtol=0)
  np.testing.assert_allclose(np.asarray(new_state), want_state, atol=1e-6, rtol=0)
  np.testing.assert_array_equal(np.asarray(new_state)[1], state[1].astype(np.float32))
  # A sequence split in two calls (state carried) equals one call.
  conv = jax.jit(causal_conv1d)
  y1, s1 = conv(f32(x[:, :4]), f32(weight), jnp.asarray(mask[:, :4]), f32(state))
  y2, s2 = conv(f32(x[:, 4:]), f32(weight), jnp.asarray(mask[:, 4:]), s1)
  np.testing.assert_allclose(np.concatenate([y1, y2], axis=1), np.asarray(y), atol=1e-6)
  np.testing.assert_allclose(np.asarray(s2), np.asarray(new_state), atol=1e-6)


def test_unit_lower_solve_matches_float64_with_nearly_parallel_keys():
  """The in-chunk WY system (I + L) X = R with L = strictly_lower(β K Kᵀ ⊙ Γ), keys 99 % parallel (where a Neumann
  product form loses all precision in float32), against float64 `np.linalg.solve`."""
  rng = np.random.default_rng(11)
  c, d = 64, 16
  keys = 0.99 * rng.standard_normal(d) + 0.01 * rng.standard_normal((3, c, d))
  keys /= np.linalg.norm(keys, axis=-1, keepdims=True)
  beta = rng.uniform(0.5, 1.0, (3, c, 1))
  gamma = np.cumsum(-rng.uniform(0.0, 0.05, (3, c)), axis=-1)
  strict = np.tril(beta * keys @ keys.swapaxes(-1, -2) * np.exp(gamma[:, :, None] - gamma[:, None, :]), -1)
  rhs = rng.standard_normal((3, c, 8))
  want = np.linalg.solve(np.eye(c) + strict, rhs)
  got = jax.jit(solve_unit_lower)(jnp.asarray(strict, jnp.float32), jnp.asarray(rhs, jnp.float32))
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=0)  # |X| up to ~4 here


@pytest.mark.parametrize("c", [64, 48, 20])  # 4 and 3 blocks of 16; 20: not a multiple, one block
def test_blocked_substitutions_equal_row_by_row_and_float64(c):
  """The blocked solves (diagonal blocks of 16 rows, matmuls below them) against the row-by-row loops they replace
  and float64 numpy, forward ((I + L)⁻¹R) and backward ((I + L)⁻ᵀR), keys 99 % parallel."""
  from sao.models import wy_solve  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(3)
  keys = 0.99 * rng.standard_normal(16) + 0.01 * rng.standard_normal((2, c, 16))
  keys /= np.linalg.norm(keys, axis=-1, keepdims=True)
  strict = np.tril(rng.uniform(0.5, 1.0, (2, c, 1)) * keys @ keys.swapaxes(-1, -2), -1)
  rhs = rng.standard_normal((2, c, 8))
  a = np.eye(c) + strict
  f32 = lambda v: jnp.asarray(v, jnp.float32)
  gdn = wy_solve  # pylint: disable=protected-access
  cases = ((gdn._blocked_forward, gdn._forward_substitution, np.linalg.solve(a, rhs)),
           (gdn._blocked_backward, gdn._backward_substitution, np.linalg.solve(a.swapaxes(-1, -2), rhs)))
  for blocked, loop, want in cases:
    got = np.asarray(jax.jit(blocked)(f32(strict), f32(rhs)))
    np.testing.assert_allclose(got, want, atol=2e-5 * max(1.0, np.abs(want).max()), rtol=0)
    np.testing.assert_allclose(got, np.asarray(jax.jit(loop)(f32(strict), f32(rhs))),
                               atol=2e-5 * max(1.0, np.abs(want).max()), rtol=0)


@pytest.mark.parametrize("c", [64, 48, 20])
def test_unit_lower_inverse_matches_float64(c):
  """(I + L)⁻¹ by blocks (diagonal blocks by substitution on the identity, block rows below by matmuls) against
  float64 `np.linalg.inv`, keys 99 % parallel, and is lower unit-triangular."""
  from sao.models.wy_solve import unit_lower_inverse  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(7)
  keys = 0.99 * rng.standard_normal(16) + 0.01 * rng.standard_normal((2, c, 16))
  keys /= np.linalg.norm(keys, axis=-1, keepdims=True)
  strict = np.tril(rng.uniform(0.5, 1.0, (2, c, 1)) * keys @ keys.swapaxes(-1, -2), -1)
  want = np.linalg.inv(np.eye(c) + strict)
  got = np.asarray(jax.jit(unit_lower_inverse)(jnp.asarray(strict, jnp.float32)))
  assert np.abs(np.tril(want, -1)).max() > 0.5  # far from the identity
  np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(want).max(), rtol=0)
  np.testing.assert_array_equal(np.triu(got, 1), 0.0)
  np.testing.assert_array_equal(np.diagonal(got, axis1=-2, axis2=-1), 1.0)


# ------------------------------------------------------------------------------- the solve's VJP (backward memory)
def _autodiff_of_the_loop(monkeypatch):
  """The chunked rule as it was before `solve_unit_lower` had a custom VJP: jax differentiates the substitution loop
  itself (the oracle for the VJP's gradients)."""
  from sao.models import gated_deltanet  # pylint: disable=g-import-not-at-top
  from sao.models import wy_solve  # pylint: disable=g-import-not-at-top
  forward_substitution = wy_solve._forward_substitution  # pylint: disable=protected-access
  monkeypatch.setattr(gated_deltanet, "solve_unit_lower",
                      lambda strict, rhs, matmul_dtype=jnp.float32: forward_substitution(strict, rhs))


def test_unit_lower_solve_vjp_matches_float64_and_autodiff():
  """dR = (I + L)⁻ᵀ dX and dL = strictly_lower(−dR Xᵀ), against float64 numpy and against autodiff of the loop
  (which agrees below the diagonal; above it L is zero by contract and the VJP gives zero)."""
  from sao.models.wy_solve import _forward_substitution  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(5)
  c, d = 9, 5
  strict = np.tril(0.3 * rng.standard_normal((2, c, c)), -1)
  rhs, dx = rng.standard_normal((2, c, d)), rng.standard_normal((2, c, d))
  a = np.eye(c) + strict
  x = np.linalg.solve(a, rhs)
  want_drhs = np.linalg.solve(a.swapaxes(-1, -2), dx)
  want_dstrict = np.tril(-want_drhs @ x.swapaxes(-1, -2), -1)
  f32 = lambda v: jnp.asarray(v, jnp.float32)
  got_x, pullback = jax.vjp(solve_unit_lower, f32(strict), f32(rhs))
  got_dstrict, got_drhs = pullback(f32(dx))
  np.testing.assert_allclose(np.asarray(got_x), x, atol=1e-5, rtol=0)
  np.testing.assert_allclose(np.asarray(got_drhs), want_drhs, atol=1e-5, rtol=0)
  np.testing.assert_allclose(np.asarray(got_dstrict), want_dstrict, atol=1e-5, rtol=0)
  auto_dstrict, auto_drhs = jax.vjp(_forward_substitution, f32(strict), f32(rhs))[1](f32(dx))
  below = np.tril(np.ones((c, c), bool), -1)
  np.testing.assert_allclose(np.asarray(got_drhs), np.asarray(auto_drhs), atol=1e-5, rtol=0)
  np.testing.assert_allclose(np.asarray(got_dstrict)[:, below], np.asarray(auto_dstrict)[:, below], atol=1e-5)


@pytest.mark.parametrize("t,chunk_size", [(13, 4), (16, 4), (7, 64)])  # 4 chunks, the last padded; 4 exact; 1
def test_chunked_values_and_gradients_equal_autodiff_of_the_loop(t, chunk_size, monkeypatch):
  """The custom VJP changes no value or gradient of the chunked rule (with random padding masks)."""
  rng = np.random.default_rng(t * 100 + chunk_size)
  _, q, k, v, g, beta, state = _random_rule_inputs(rng, b=2, t=t)
  args = tuple(jnp.asarray(x, jnp.float32) for x in (q, k, v, g, beta, state))
  weights = jnp.asarray(rng.standard_normal(v.shape), jnp.float32)
  state_weights = jnp.asarray(rng.standard_normal(state.shape), jnp.float32)

  def value_and_grads():
    def loss(*a):
      out, s = chunked_gated_delta_rule(*a, chunk_size=chunk_size)
      return jnp.sum(out * weights) + jnp.sum(s * state_weights), (out, s)
    return jax.jit(jax.grad(loss, argnums=tuple(range(6)), has_aux=True))(*args)

  grads, (out, s) = value_and_grads()
  _autodiff_of_the_loop(monkeypatch)
  want_grads, (want_out, want_s) = value_and_grads()
  # The forward multiplies by the blocked inverse where the loop substitutes: float32 rounding apart.
  np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), atol=1e-6, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(s), np.asarray(want_s), atol=1e-6, rtol=1e-6)
  for name, got, want in zip("q k v g beta state".split(), grads, want_grads):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5, err_msg=name)


def test_chunked_backward_saves_no_per_row_copies_of_the_solve():
  """What the backward keeps (the leaves of `jax.vjp`'s pullback) holds no array larger than the solve's
  [N, B, H, C, Dk + Dv] right-hand side or the [N, B, H, C, C] in-chunk matrices; differentiating the substitution
  loop itself kept C copies of the right-hand side."""
  rng = np.random.default_rng(1)
  b, t, h, dk, dv, c = 1, 64, 2, 8, 4, 16
  _, q, k, v, g, beta, _ = _random_rule_inputs(rng, b=b, t=t, h=h, dk=dk, dv=dv)
  args = tuple(jnp.asarray(x, jnp.float32) for x in (q, k, v, g, beta))
  _, pullback = jax.vjp(lambda *a: chunked_gated_delta_rule(*a, chunk_size=c), *args)
  bound = (t // c) * b * h * c * max(dk + dv, c)
  sizes = sorted(leaf.size for leaf in jax.tree.leaves(pullback))
  assert sizes[-1] <= bound, sizes


@pytest.mark.parametrize("t", [21])  # three chunks of C = 8, the last padded (the kernel tests vary the counts)
def test_block_gradients_equal_autodiff_of_the_loop(t, monkeypatch):
  """The whole `linear_attn` block (tiny qwen3_5, float32): output and gradients of every param and of x equal those
  of the block differentiated through the substitution loop, with padding at random positions."""
  from sao.models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  from sao.models.gated_deltanet import GatedDeltaNet  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  cfg = ModelConfig.tiny("qwen3_5_moe_text", dtype="float32", param_dtype="float32")
  rng = np.random.default_rng(t)
  x = jnp.asarray(rng.standard_normal((2, t, cfg.hidden_size)), jnp.float32)
  mask = rng.random((2, t)) < 0.75
  mask[:, -1] = True
  mask = jnp.asarray(mask, jnp.int32)
  dy = jnp.asarray(rng.standard_normal((2, t, cfg.hidden_size)), jnp.float32)
  module = GatedDeltaNet(cfg)
  params = nn.meta.unbox(module.init(jax.random.key(t), x, mask, None)["params"])

  def value_and_grads():
    def loss(p, h):
      out = module.apply({"params": p}, h, mask, None)[0]
      return jnp.sum(out * dy), out
    return jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(params, x)

  grads, out = value_and_grads()
  _autodiff_of_the_loop(monkeypatch)
  want_grads, want_out = value_and_grads()
  np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), atol=1e-6, rtol=1e-6)
  flat, want_flat = jax.tree_util.tree_flatten_with_path(grads)[0], jax.tree.leaves(want_grads)
  for (path, got), want in zip(flat, want_flat):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-4, err_msg=str(path))
