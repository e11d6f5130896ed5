"""`sao.models.grouped_matmul`: values and gradients (d_lhs, d_rhs) of every kernel = a float64 NumPy loop and
jax.lax.ragged_dot's autodiff, on random shapes and group sizes (empty groups, rows past Σ group_sizes); the Pallas
megablox kernels through the Pallas interpreter; which kernels a TPU lowering from this CPU host gets."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from sao.models import grouped_matmul as gm


def _reference(lhs, rhs, sizes, d_out):
  """float64 loop: out, d_lhs = d_out @ rhs[g]ᵀ and d_rhs[g] = lhs_gᵀ d_out_g per group; rows past Σ: 0."""
  lhs, rhs, d_out = (np.asarray(a, np.float64) for a in (lhs, rhs, d_out))
  out, d_lhs, d_rhs = np.zeros((lhs.shape[0], rhs.shape[2])), np.zeros_like(lhs), np.zeros_like(rhs)
  start = 0
  for g, n in enumerate(sizes):
    rows = slice(start, start + n)
    out[rows] = lhs[rows] @ rhs[g]
    d_lhs[rows] = d_out[rows] @ rhs[g].T
    d_rhs[g] = lhs[rows].T @ d_out[rows]
    start += n
  return out, d_lhs, d_rhs


def _case(seed, m, k, n, groups, dtype=np.float32):
  """Random operands; group sizes with empty groups and (for odd seeds) rows left past Σ group_sizes."""
  rng = np.random.default_rng(seed)
  total = m if seed % 2 == 0 else int(rng.integers(m // 2, m))
  cuts = np.sort(rng.integers(0, total + 1, size=groups - 2))
  sizes = np.diff(np.concatenate([[0], cuts, [total]]))
  sizes = np.insert(sizes, rng.integers(0, groups), 0).astype(np.int32)  # at least one empty group
  lhs = rng.standard_normal((m, k)).astype(dtype)
  rhs = rng.standard_normal((groups, k, n)).astype(dtype)
  d_out = rng.standard_normal((m, n)).astype(dtype)
  return lhs, rhs, sizes, d_out


def _value_and_grads(impl, lhs, rhs, sizes, d_out):
  def pullback(a, b):
    out, vjp = jax.vjp(lambda a, b: gm.grouped_matmul(a, b, jnp.asarray(sizes), impl=impl), a, b)
    return (out,) + vjp(d_out)
  return [np.asarray(x, np.float64) for x in jax.jit(pullback)(lhs, rhs)]


def _assert_close(got, want, tol):
  for name, g, w in zip(("out", "d_lhs", "d_rhs"), got, want):
    scale = max(1.0, float(np.max(np.abs(w))))
    np.testing.assert_allclose(g, w, atol=tol * scale, rtol=0, err_msg=name)


SHAPES = [(0, 37, 12, 9, 5), (1, 64, 16, 24, 8), (2, 200, 8, 6, 13), (3, 96, 20, 10, 3)]


@pytest.mark.parametrize("impl", ["tiled", "xla", "auto"])
@pytest.mark.parametrize("seed,m,k,n,groups", SHAPES)
def test_values_and_gradients_match_reference_and_ragged_dot(impl, seed, m, k, n, groups):
  lhs, rhs, sizes, d_out = _case(seed, m, k, n, groups)
  want = _reference(lhs, rhs, sizes, d_out)
  got = _value_and_grads(impl, lhs, rhs, sizes, d_out)
  _assert_close(got, want, 1e-5)  # float32 sums in another order than the float64 loop
  _assert_close(got, _value_and_grads("ragged_dot", lhs, rhs, sizes, d_out), 1e-5)
  assert np.all(got[0][sizes.sum():] == 0) and np.all(got[1][sizes.sum():] == 0)  # rows past Σ: exactly 0


@pytest.mark.parametrize("seed,m,k,n,groups", [(5, 150, 24, 16, 6), (6, 100, 128, 128, 4)])
def test_megablox_kernels_in_the_pallas_interpreter(seed, m, k, n, groups):
  """The TPU kernels (gmm forward and d_lhs with the transposed rhs, tgmm for d_rhs), row tiles of 256 and 128
  rows with M padded to them, interpreted on CPU."""
  lhs, rhs, sizes, d_out = _case(seed, m, k, n, groups)
  _assert_close(_value_and_grads("megablox_interpret", lhs, rhs, sizes, d_out), _reference(lhs, rhs, sizes, d_out),
                1e-5)


@pytest.mark.parametrize("impl", ["tiled", "xla", "megablox_interpret"])
def test_transposed_grouped_matmul(impl):
  lhs, _, sizes, d_out = _case(7, 80, 16, 12, 7)
  want = _reference(lhs, np.zeros((7, 16, 12), np.float32), sizes, d_out)[2]
  got = jax.jit(lambda a, b: gm.transposed_grouped_matmul(a, b, jnp.asarray(sizes), impl=impl))(lhs, d_out)
  assert got.shape == (7, 16, 12) and got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5 * np.max(np.abs(want)), rtol=0)
  assert np.all(np.asarray(got)[sizes == 0] == 0)


def test_bf16_gradients_keep_dtypes():
  lhs, rhs, sizes, d_out = _case(4, 64, 16, 8, 4)
  bf = lambda a: jnp.asarray(a, jnp.bfloat16)
  @jax.jit
  def pullback(a, b, d):
    out, vjp = jax.vjp(lambda a, b: gm.grouped_matmul(a, b, jnp.asarray(sizes)), a, b)
    return (out,) + vjp(d)
  out, d_lhs, d_rhs = pullback(bf(lhs), bf(rhs), bf(d_out))
  assert (out.dtype, d_lhs.dtype, d_rhs.dtype) == (jnp.bfloat16,) * 3
  want = _reference(*(np.asarray(bf(a), np.float32) for a in (lhs, rhs)), sizes, np.asarray(bf(d_out), np.float32))
  _assert_close([np.asarray(x, np.float64) for x in (out, d_lhs, d_rhs)], want, 2e-2)  # bf16 outputs: 8 bits


def test_bad_arguments_are_named():
  lhs, rhs, sizes = np.zeros((4, 3), np.float32), np.zeros((2, 3, 5), np.float32), np.array([1, 2], np.int32)
  with pytest.raises(ValueError, match="impl: unsupported 'nonsense'"):
    gm.grouped_matmul(lhs, rhs, sizes, impl="nonsense")
  with pytest.raises(ValueError, match=r"expected lhs \[M, K\], rhs \[G, K, N\]"):
    gm.grouped_matmul(lhs, rhs[:, :2], sizes)
  with pytest.raises(ValueError, match="impl: unsupported 'ragged_dot'"):
    gm.transposed_grouped_matmul(lhs, np.zeros((4, 5), np.float32), sizes, impl="ragged_dot")


_ARGS = (jax.ShapeDtypeStruct((256, 128), jnp.bfloat16), jax.ShapeDtypeStruct((4, 128, 256), jnp.bfloat16),
         jax.ShapeDtypeStruct((4,), jnp.int32))


def _grad(impl):
  return jax.grad(lambda a, b, s: jnp.sum(gm.grouped_matmul(a, b, s, impl).astype(jnp.float32)), argnums=(0, 1))


def _ragged_dots(text):
  return [line for line in text.splitlines() if "chlo.ragged_dot" in line]


def test_tpu_lowering_has_no_ragged_contracting_dot():
  """ragged_dot's own weight gradient is a ragged dot over the contracting dimension (no rhs group dimension),
  which XLA's TPU compiler lowers dense over the groups; the custom VJP's TPU lowering (GSPMD, no manual mesh) has
  only the grouped kind (forward and d_lhs), and the CPU lowering none at all."""
  oracle = _ragged_dots(jax.jit(_grad("ragged_dot")).trace(*_ARGS).lower(lowering_platforms=("tpu",)).as_text())
  assert any("rhs_group_dimensions" not in line for line in oracle)  # the transposed kind exists in the oracle
  traced = jax.jit(_grad("auto")).trace(*_ARGS)
  ours = _ragged_dots(traced.lower(lowering_platforms=("tpu",)).as_text())
  assert ours and all("rhs_group_dimensions = [0]" in line for line in ours)
  assert not _ragged_dots(traced.lower(lowering_platforms=("cpu",)).as_text())


def test_gpu_lowering_is_the_tiled_kernel_not_ragged_dot():
  """Lowered for cuda (and rocm), "auto" is the tiled kernel, forward and backward: no ragged dot, which XLA:GPU
  runs dense over the groups (issue 47: temporaries G·M·K on an H200); the text equals "tiled"'s own lowering."""
  for platform in ("cuda", "rocm"):
    auto = jax.jit(_grad("auto")).trace(*_ARGS).lower(lowering_platforms=(platform,)).as_text()
    tiled = jax.jit(_grad("tiled")).trace(*_ARGS).lower(lowering_platforms=(platform,)).as_text()
    assert not _ragged_dots(auto) and "ragged" not in auto
    assert auto.count("stablehlo.dot_general") == tiled.count("stablehlo.dot_general") > 0
  assert _ragged_dots(jax.jit(_grad("xla")).trace(*_ARGS).lower(lowering_platforms=("cuda",)).as_text())


def test_tpu_lowering_in_a_manual_mesh_uses_megablox():
  """Inside a shard_map manual over every mesh axis (check_vma=False, as the kernels' outputs carry no varying-axes
  type) the TPU lowering calls the Mosaic kernels (d_lhs gmm and d_rhs tgmm) and no ragged dot."""
  mesh = jax.make_mesh((1,), ("x",))

  def per_shard(a, b, s):
    return jax.shard_map(_grad("auto"), mesh=mesh, in_specs=(P(), P(), P()), out_specs=(P(), P()),
                         check_vma=False)(a, b, s)

  with jax.set_mesh(mesh):
    text = jax.jit(per_shard).trace(*_ARGS).lower(lowering_platforms=("tpu",)).as_text()
  assert text.count("tpu_custom_call") == 2 and not _ragged_dots(text)


@pytest.mark.parametrize("impl", ["tiled", "xla", "auto", "megablox_interpret", "ragged_dot"])
@pytest.mark.parametrize("seed,m,k,n,groups", [SHAPES[1], (5, 150, 24, 16, 6)])
def test_transpose_rhs_reads_the_out_in_layout(impl, seed, m, k, n, groups):
  """rhs given as [G, N, K] with transpose_rhs = the [G, K, N] call (values, d_lhs, and d_rhs in the [G, N, K]
  layout), against the float64 loop and ragged_dot's autodiff of the untransposed operand."""
  lhs, rhs, sizes, d_out = _case(seed, m, k, n, groups)
  rhs_t = np.ascontiguousarray(rhs.swapaxes(1, 2))

  def pullback(a, b):
    out, vjp = jax.vjp(lambda a, b: gm.grouped_matmul(a, b, jnp.asarray(sizes), impl=impl, transpose_rhs=True), a, b)
    return (out,) + vjp(d_out)
  out, d_lhs, d_rhs_t = (np.asarray(x, np.float64) for x in jax.jit(pullback)(lhs, rhs_t))
  assert d_rhs_t.shape == (groups, n, k)
  got = [out, d_lhs, d_rhs_t.swapaxes(1, 2)]
  _assert_close(got, _reference(lhs, rhs, sizes, d_out), 1e-5)
  _assert_close(got, _value_and_grads("ragged_dot", lhs, rhs, sizes, d_out), 1e-5)


def test_transpose_rhs_checks_the_contracting_dim():
  lhs, sizes = np.zeros((4, 3), np.float32), np.array([1, 2], np.int32)
  with pytest.raises(ValueError, match=r"rhs \[G, N, K\]"):
    gm.grouped_matmul(lhs, np.zeros((2, 3, 5), np.float32), sizes, transpose_rhs=True)
