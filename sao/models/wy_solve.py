"""The unit lower-triangular solve of Gated DeltaNet's WY form, and the precision of the chunked form's matmuls.

Inside a chunk of C tokens the C delta-rule updates combine into `[U | W] = (I + L)⁻¹ R` for a strictly lower L
[..., C, C] (`sao.models.gated_deltanet.chunked_gated_delta_rule`). `solve_unit_lower` computes it through the
inverse `(I + L)⁻¹` (`unit_lower_inverse`: 16-row diagonal blocks inverted by substitution on the identity, merged
by block rows, as flash-linear-attention's `solve_tril`) with a custom VJP that keeps only the inverse and X. The
row-by-row substitutions (`_forward_substitution`, `_backward_substitution`, and their blocked forms) are the
oracles. `chunk_matmul`: the chunked form's products in f32 at HIGHEST precision, or with bf16 operands and f32
accumulation (`ModelConfig.linear_attn_matmul`, `MATMUL_DTYPES`).
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array
# The state is a running sum over the whole sequence: TPU's default bf16-pass matmuls would compound their error.
_HIGHEST = jax.lax.Precision.HIGHEST
MATMUL_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def chunk_matmul(eq: str, x: Array, y: Array, dtype: Any = jnp.float32) -> Array:
  """`einsum(eq, x, y)` in float32: f32 operands at HIGHEST precision, or (`dtype` bf16) the operands cast to bf16
  and the products accumulated in f32 (`preferred_element_type`)."""
  if dtype == jnp.float32:
    return jnp.einsum(eq, x.astype(jnp.float32), y.astype(jnp.float32), precision=_HIGHEST)
  return jnp.einsum(eq, x.astype(dtype), y.astype(dtype), preferred_element_type=jnp.float32)



def _forward_substitution(strict: Array, rhs: Array) -> Array:
  """X = (I + L)⁻¹ R, row by row: `x_i = r_i − Σ_{j<i} L_ij x_j` (see `solve_unit_lower`)."""
  def row(i, x):
    l_i = jax.lax.dynamic_index_in_dim(strict, i, axis=-2, keepdims=False)  # [..., C]; zero at j >= i
    r_i = jax.lax.dynamic_index_in_dim(rhs, i, axis=-2, keepdims=False)  # [..., D]
    x_i = r_i - jnp.einsum("...j,...jd->...d", l_i, x, precision=_HIGHEST)
    return jax.lax.dynamic_update_index_in_dim(x, x_i, i, axis=-2)

  return jax.lax.fori_loop(0, strict.shape[-1], row, rhs)


def _backward_substitution(strict: Array, rhs: Array) -> Array:
  """Y = (I + L)⁻ᵀ R, last row first: `y_i = r_i − Σ_{j>i} L_ji y_j` (L strictly lower, so Lᵀ strictly upper)."""
  c = strict.shape[-1]

  def row(step, y):
    i = c - 1 - step
    l_col = jax.lax.dynamic_index_in_dim(strict, i, axis=-1, keepdims=False)  # [..., C]: L_ji; zero at j <= i
    r_i = jax.lax.dynamic_index_in_dim(rhs, i, axis=-2, keepdims=False)
    y_i = r_i - jnp.einsum("...j,...jd->...d", l_col, y, precision=_HIGHEST)
    return jax.lax.dynamic_update_index_in_dim(y, y_i, i, axis=-2)

  return jax.lax.fori_loop(0, c, row, rhs)


# Rows of a diagonal block of the blocked substitutions: each row step then reads a [SOLVE_BLOCK, D] block, not the
# whole [C, D] solution, and the blocks below it are updated by one matmul per block.
SOLVE_BLOCK = 16


def _blocked_forward(strict: Array, rhs: Array, block: int = SOLVE_BLOCK) -> Array:
  """`_forward_substitution` by diagonal blocks of `block` rows: X_i = (I + L_ii)⁻¹ (R_i − L_{i,<i} X_{<i}) — the
  same arithmetic reassociated (the off-diagonal sums as matmuls), so the same stability. C not a multiple of
  `block`: one block."""
  c = strict.shape[-1]
  if c % block or c <= block:
    return _forward_substitution(strict, rhs)
  solved = []
  for lo in range(0, c, block):  # C / block (≤ 8) unrolled steps
    r = rhs[..., lo:lo + block, :]
    if solved:
      r = r - jnp.einsum("...ij,...jd->...id", strict[..., lo:lo + block, :lo], jnp.concatenate(solved, axis=-2),
                         precision=_HIGHEST)
    solved.append(_forward_substitution(strict[..., lo:lo + block, lo:lo + block], r))
  return jnp.concatenate(solved, axis=-2)


def _blocked_backward(strict: Array, rhs: Array, block: int = SOLVE_BLOCK) -> Array:
  """`_backward_substitution` by diagonal blocks, last first: Y_i = (I + L_ii)⁻ᵀ (R_i − L_{>i,i}ᵀ Y_{>i})."""
  c = strict.shape[-1]
  if c % block or c <= block:
    return _backward_substitution(strict, rhs)
  solved = []  # the blocks after the current one, in order
  for lo in range(c - block, -1, -block):
    r = rhs[..., lo:lo + block, :]
    if solved:
      r = r - jnp.einsum("...ji,...jd->...id", strict[..., lo + block:, lo:lo + block],
                         jnp.concatenate(solved, axis=-2), precision=_HIGHEST)
    solved.insert(0, _backward_substitution(strict[..., lo:lo + block, lo:lo + block], r))
  return jnp.concatenate(solved, axis=-2)


def unit_lower_inverse(strict: Array, block: int = SOLVE_BLOCK) -> Array:
  """(I + L)⁻¹ for a strictly lower L [..., C, C]: the C / `block` diagonal blocks inverted at once by forward
  substitution on the identity (`block` row steps over [..., C / block, block, block]), then the block rows below them
  by block substitution — for A = [[A₁₁, 0], [L₂₁, A₂₂]], A⁻¹ = [[A₁₁⁻¹, 0], [−A₂₂⁻¹ L₂₁ A₁₁⁻¹, A₂₂⁻¹]] — one pair of
  matmuls per block row (flash-linear-attention's `solve_tril` builds the same inverse). C not a multiple of
  `block`: row-by-row substitution on the identity."""
  c = strict.shape[-1]
  if c % block or c <= block:
    return _forward_substitution(strict, jnp.broadcast_to(jnp.eye(c, dtype=strict.dtype), strict.shape))
  n = c // block
  diagonal = jnp.stack([strict[..., i * block:(i + 1) * block, i * block:(i + 1) * block] for i in range(n)], -3)
  diagonal_inverse = _forward_substitution(
      diagonal, jnp.broadcast_to(jnp.eye(block, dtype=strict.dtype), diagonal.shape))  # [..., n, b, b]
  inverse = diagonal_inverse[..., 0, :, :]
  for i in range(1, n):  # ≤ 7 unrolled block rows
    lo = i * block
    below = -jnp.einsum("...ij,...jk,...kl->...il", diagonal_inverse[..., i, :, :], strict[..., lo:lo + block, :lo],
                        inverse, precision=_HIGHEST)  # [..., b, lo]
    top = jnp.concatenate([inverse, jnp.zeros(inverse.shape[:-1] + (block,), inverse.dtype)], axis=-1)
    inverse = jnp.concatenate([top, jnp.concatenate([below, diagonal_inverse[..., i, :, :]], axis=-1)], axis=-2)
  return inverse


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def solve_unit_lower(strict: Array, rhs: Array, matmul_dtype: Any = jnp.float32) -> Array:
  """X = (I + L)⁻¹ R: the inverse of the unit lower-triangular matrix (`unit_lower_inverse`, blocked substitution on
  the identity: its row steps read [C, C]-sized blocks, not the [C, D] right-hand side) times R, one matmul.

  strict: [..., C, C], the strictly lower triangle L (entries on and above the diagonal must be zero);
  rhs: [..., C, D]. (XLA:CPU's `lax.linalg.triangular_solve` takes ~8 ms per batched 64×64 system, ~70× slower than
  substitution; substitution, not a Neumann-series product, is what keeps the WY solve stable when keys are nearly
  parallel. `_blocked_forward`, substitution on R itself, is the test oracle: with D = Dk + Dv = 256 columns against
  C = 64 its row steps moved 4× the bytes, docs/history.md "Gated DeltaNet: the WY solve in blocks".)

  Gradient (a custom VJP): with A = I + L and X = A⁻¹R, `dR = A⁻ᵀ dX` (the inverse's transpose, one matmul) and
  `dL = strictly_lower(−dR Xᵀ)` (zero on and above the diagonal, where L is zero by contract). Autodiff of a
  substitution loop would save the whole [..., C, D] carry at each of its C steps for the backward — C times the
  size of X ([64, N, B, H, 64, Dk + Dv] float32 in `chunked_gated_delta_rule`: 4 GiB per chip for Qwen3.5-35B-A3B at
  32,768 tokens on a v5p-128, docs/history.md); this VJP keeps only A⁻¹ and X.

  `matmul_dtype`: the precision of the products by A⁻¹ and of dL (`chunk_matmul`); A⁻¹ itself is built in f32.
  """
  return _solve_fwd(strict, rhs, matmul_dtype)[0]


def _solve_fwd(strict: Array, rhs: Array, matmul_dtype: Any = jnp.float32) -> tuple[Array, tuple[Array, Array]]:
  inverse = unit_lower_inverse(strict)
  x = chunk_matmul("...ij,...jd->...id", inverse, rhs, matmul_dtype)
  return x, (inverse, x)


def _solve_bwd(matmul_dtype: Any, residuals: tuple[Array, Array], dx: Array) -> tuple[Array, Array]:
  inverse, x = residuals
  drhs = chunk_matmul("...ji,...jd->...id", inverse, dx, matmul_dtype)
  c = inverse.shape[-1]
  below = jnp.tril(jnp.ones((c, c), bool), -1)
  dstrict = jnp.where(below, -chunk_matmul("...id,...jd->...ij", drhs, x, matmul_dtype), 0.0)
  return dstrict.astype(inverse.dtype), drhs.astype(x.dtype)


solve_unit_lower.defvjp(lambda strict, rhs, matmul_dtype: _solve_fwd(strict, rhs, matmul_dtype), _solve_bwd)
