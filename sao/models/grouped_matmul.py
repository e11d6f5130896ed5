"""Grouped matmul with its own backward: `out[m] = lhs[m] @ rhs[g(m)]` for rows grouped consecutively by group.

lhs [M, K], rhs [G, K, N], group_sizes [G] int32 with Σ ≤ M → out [M, N]; rows past Σ group_sizes are 0 (with
`zero_tail=False` they are undefined — megablox leaves them unwritten — and the caller must ignore them: it saves an
[M, N] select per product and per d_lhs). With
`transpose_rhs` rhs is [G, N, K] (per group `[out, in]`, HF's layout of stacked expert weights) and
`out[m] = lhs[m] @ rhs[g(m)]ᵀ`, with no transposed copy of rhs made (megablox's `gmm` option of the same name).
Backward (`jax.custom_vjp`), with the same row grouping:
  d_lhs = gmm(d_out, rhsᵀ)               [M, N] × [G, N, K] → [M, K]   (a grouped matmul again)
  d_rhs[g] = Σ_{m in g} lhs[m]ᵀ d_out[m]   [K, M] × [M, N] → [G, K, N]  (the transposed grouped matmul, `tgmm`)
  (transpose_rhs: d_lhs = gmm(d_out, rhs) and d_rhs[g] = Σ_{m in g} d_out[m]ᵀ lhs[m] → [G, N, K], tgmm with its
  operands swapped, so neither pass transposes a weight-sized array.)

Why not `jax.lax.ragged_dot`'s own transpose: its d_rhs is a ragged dot whose *contracting* dimension is ragged, and
XLA's TPU compiler (libtpu 0.0.42.1) lowers that as a masked convolution dense over the groups, with a `pred[G, M, 1]`
group mask that the TPU layout pads to 128 lanes: 64 GiB per chip at G = 256 experts and M = 2,097,152 rows (8 × 32,768
tokens × top-8), docs/history.md, 2026-11-30. ragged_dot stays as the test oracle (impl="ragged_dot").

Kernels (`impl`, "auto" picks by the platform being lowered for, `lax.platform_dependent`, so an ahead-of-time TPU
or GPU compile from a CPU host gets that platform's choice):
  "tiled"     (CPU, GPU) each group padded to tiles of `tile` rows, tile = clip(M // G, 1, 128); the forward and d_lhs
              are batched matmuls over tiles with one gathered weight per tile, d_rhs the per-tile outer products
              `lhs_tileᵀ d_out_tile` [T, K, N] summed into their groups (a scatter-add, nothing dense in G).
              On GPU because XLA:GPU lowers `ragged_dot` dense over the groups: issue 47 measured on an H200 (M =
              16,384 rows of 2,048, bf16) temporaries of exactly G·M·K and forward + backward 19.4 ms at G = 128,
              against 3.3 ms for "tiled"; its gathered weights are [T, K, N], T ≈ M / tile + G.
  "xla"       (TPU under GSPMD) forward and d_lhs `jax.lax.ragged_dot` (ragged rows: XLA lowers them as grouped
              matmuls), d_rhs the tiled tgmm with tile = M // G (no cap: at most 2·G tiles, so the per-tile
              products [T, K, N] are at most 2× rhs and the padded rows at most M). Plain XLA ops, which GSPMD shards.
  "megablox"  (TPU) the Pallas kernels `gmm` / `tgmm` of `jax.experimental.pallas.ops.tpu.megablox` (what MaxText's
              MoE uses), tiles (512, 1024, 1024) clipped to the shape, M padded to a multiple of the row tile.
              Mosaic kernels cannot be partitioned by GSPMD ("Mosaic kernels cannot be automatically partitioned.
              Please wrap the call in a shard_map"), so "auto" uses them only where every mesh axis is manual
              (inside a shard_map over the whole mesh); a multi-chip jit without one gets "xla".
  "megablox_interpret"  the same kernels in Pallas's interpreter (any platform; the tests).
  "ragged_dot"  `jax.lax.ragged_dot` with jax's autodiff (the oracle).
"""
from __future__ import annotations

import functools
import importlib

import jax
import jax.numpy as jnp

Array = jax.Array
IMPLS = ("auto", "tiled", "xla", "megablox", "megablox_interpret", "ragged_dot")
_TILED_MAX_TILE = 128
_MEGABLOX_TILING = (512, 1024, 1024)  # MaxText's default MoE tiles (rows, contracting, output)


def grouped_matmul(lhs: Array, rhs: Array, group_sizes: Array, impl: str = "auto",
                   transpose_rhs: bool = False, zero_tail: bool = True) -> Array:
  """lhs [M, K], rhs [G, K, N] (transpose_rhs: [G, N, K], used as its per-group transpose), group_sizes [G]
  (Σ ≤ M) → [M, N] in lhs.dtype; rows past Σ are 0, or undefined without `zero_tail` (module doc)."""
  if impl not in IMPLS:
    raise ValueError(f"impl: unsupported {impl!r}; expected one of {IMPLS}")
  contracting = 2 if transpose_rhs else 1
  if (lhs.ndim != 2 or rhs.ndim != 3 or group_sizes.shape != (rhs.shape[0],)
      or lhs.shape[1] != rhs.shape[contracting]):
    expected = "[G, N, K]" if transpose_rhs else "[G, K, N]"
    raise ValueError(f"grouped_matmul: expected lhs [M, K], rhs {expected}, group_sizes [G]; got {lhs.shape}, "
                     f"{rhs.shape}, {group_sizes.shape}")
  lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes, jnp.int32)
  if impl == "ragged_dot":
    return jax.lax.ragged_dot(lhs, rhs.swapaxes(1, 2) if transpose_rhs else rhs, group_sizes)
  return _gmm_vjp(lhs, rhs.astype(lhs.dtype), group_sizes, impl, bool(transpose_rhs), bool(zero_tail))


def transposed_grouped_matmul(lhs: Array, d_out: Array, group_sizes: Array, impl: str = "auto") -> Array:
  """`out[g] = Σ_{m in group g} lhs[m]ᵀ d_out[m]`: lhs [M, K], d_out [M, N], group_sizes [G] → [G, K, N] float32;
  rows past Σ group_sizes are ignored, an empty group gives 0."""
  if impl not in IMPLS or impl == "ragged_dot":
    raise ValueError(f"impl: unsupported {impl!r}; expected one of {IMPLS[:-1]}")
  return _tgmm(jnp.asarray(lhs), jnp.asarray(d_out), jnp.asarray(group_sizes, jnp.int32), impl, jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _gmm_vjp(lhs: Array, rhs: Array, group_sizes: Array, impl: str, transpose_rhs: bool, zero_tail: bool) -> Array:
  return _gmm(lhs, rhs, group_sizes, impl, transpose_rhs, zero_tail)


def _gmm_fwd(lhs, rhs, group_sizes, impl, transpose_rhs, zero_tail):
  return _gmm(lhs, rhs, group_sizes, impl, transpose_rhs, zero_tail), (lhs, rhs, group_sizes)


def _gmm_bwd(impl, transpose_rhs, zero_tail, residuals, d_out):
  lhs, rhs, group_sizes = residuals
  d_out = jnp.asarray(d_out).astype(lhs.dtype)
  # d_lhs's rows past Σ are what the forward's caller ignored: undefined too without zero_tail. d_rhs reads only
  # the rows of its groups (megablox's tgmm selects them), so undefined rows of d_out or lhs do not reach it.
  d_lhs = _gmm(d_out, rhs, group_sizes, impl, not transpose_rhs, zero_tail)
  # rhs [G, N, K] when transposed: Σ d_outᵀ lhs has its layout, Σ lhsᵀ d_out the [G, K, N] one.
  d_rhs = (_tgmm(d_out, lhs, group_sizes, impl, rhs.dtype) if transpose_rhs
           else _tgmm(lhs, d_out, group_sizes, impl, rhs.dtype))
  return d_lhs.astype(lhs.dtype), d_rhs, None  # group_sizes: integers, no cotangent


_gmm_vjp.defvjp(_gmm_fwd, _gmm_bwd)


def _gmm(lhs: Array, rhs: Array, group_sizes: Array, impl: str, transpose_rhs: bool, zero_tail: bool = True) -> Array:
  """lhs @ rhs[g] per group; rhs [G, K, N], or [G, N, K] used transposed when transpose_rhs. Only megablox leaves
  the rows past Σ group_sizes undefined when `zero_tail` is False; the other kernels write zeros there."""
  kernels = {
      "tiled": lambda a, b, s: _tiled_matmul(a, b, s, _TILED_MAX_TILE, transpose_rhs),
      "xla": lambda a, b, s: _ragged_dot(a, b, s, transpose_rhs),
      "megablox": lambda a, b, s: _megablox_gmm(a, b, s, transpose_rhs, interpret=False, zero_tail=zero_tail),
      "megablox_interpret": lambda a, b, s: _megablox_gmm(a, b, s, transpose_rhs, interpret=True,
                                                          zero_tail=zero_tail),
  }
  if impl != "auto":
    return kernels[impl](lhs, rhs, group_sizes)
  return jax.lax.platform_dependent(lhs, rhs, group_sizes, tpu=kernels[_tpu_impl()], default=kernels["tiled"])


def _tgmm(lhs: Array, d_out: Array, group_sizes: Array, impl: str, dtype) -> Array:
  n_groups = group_sizes.shape[0]
  kernels = {
      "tiled": lambda a, b, s: _tiled_tmatmul(a, b, s, _TILED_MAX_TILE).astype(dtype),
      "xla": lambda a, b, s: _tiled_tmatmul(a, b, s, None).astype(dtype),
      "megablox": lambda a, b, s: _megablox_tgmm(a, b, s, dtype, interpret=False),
      "megablox_interpret": lambda a, b, s: _megablox_tgmm(a, b, s, dtype, interpret=True),
  }
  if n_groups == 0:
    return jnp.zeros((0, lhs.shape[1], d_out.shape[1]), dtype)
  if impl != "auto":
    return kernels[impl](lhs, d_out, group_sizes)
  return jax.lax.platform_dependent(lhs, d_out, group_sizes, tpu=kernels[_tpu_impl()], default=kernels["tiled"])


def _tpu_impl() -> str:
  """Pallas where Mosaic may run (every axis of the context mesh manual), else XLA ops that GSPMD can shard."""
  mesh = jax.sharding.get_abstract_mesh()
  return "megablox" if not mesh.empty and mesh.are_all_axes_manual else "xla"


# ---------------------------------------------------------------------------------------------------------------
# Tiles in jnp (CPU and GPU; the XLA path's d_rhs).

def _tile_layout(group_sizes: Array, m: int, max_tile: int | None):
  """Tiles of `tile` rows, each inside one group: tile t holds rows `src[t]` (masked by `valid[t]`) of group
  `group_of_tile[t]`. tile = clip(M // G, 1, max_tile), so at most T = (M + G·(tile−1)) // tile tiles exist and the
  padding is at most G·(tile−1) ≤ M rows (max_tile None: no cap, at most 2·G tiles).
  → (tile, group_of_tile [T], src [T, tile], valid [T, tile], row_end [G], row_start [G], tile_start [G])."""
  n_groups = group_sizes.shape[0]
  tile = max(1, m // n_groups) if max_tile is None else max(1, min(max_tile, m // n_groups))
  n_tiles = max(1, (m + n_groups * (tile - 1)) // tile)
  tiles_per_group = -(-group_sizes // tile)
  tile_end = jnp.cumsum(tiles_per_group)
  tile_start = tile_end - tiles_per_group
  row_end = jnp.cumsum(group_sizes)
  row_start = row_end - group_sizes
  t = jnp.arange(n_tiles, dtype=jnp.int32)
  group_of_tile = jnp.minimum(_count_at_most(tile_end, n_tiles), n_groups - 1)
  offset = (t - tile_start[group_of_tile])[:, None] * tile + jnp.arange(tile, dtype=jnp.int32)[None, :]  # [T, tile]
  valid = (t < tile_end[-1])[:, None] & (offset < group_sizes[group_of_tile][:, None])
  src = jnp.where(valid, row_start[group_of_tile][:, None] + offset, 0)
  return tile, group_of_tile, src, valid, row_end, row_start, tile_start


def _ragged_dot(lhs: Array, rhs: Array, group_sizes: Array, transpose_rhs: bool) -> Array:
  """`jax.lax.ragged_dot` of lhs [M, K] with rhs [G, K, N], or [G, N, K] contracted on its last dim."""
  contract = 2 if transpose_rhs else 1
  dims = jax.lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(([1], [contract]), ([], [])),
                                           lhs_ragged_dimensions=[0], rhs_group_dimensions=[0])
  return jax.lax.ragged_dot_general(lhs, rhs, group_sizes, dims)


def _tiled_matmul(lhs: Array, rhs: Array, group_sizes: Array, max_tile: int | None,
                  transpose_rhs: bool = False) -> Array:
  """Grouped matmul as a batched matmul over tiles (`_tile_layout`), one gathered weight [K, N] (transpose_rhs:
  [N, K]) per tile: FLOPs ≤ 2·(2·M·K·N); the gathered weights are [T, K, N] ([T, N, K])."""
  m, n_groups = lhs.shape[0], rhs.shape[0]
  if n_groups == 0:
    return jnp.zeros((m, rhs.shape[1] if transpose_rhs else rhs.shape[2]), lhs.dtype)
  tile, group_of_tile, src, valid, row_end, row_start, tile_start = _tile_layout(group_sizes, m, max_tile)
  n_tiles = src.shape[0]
  lhs_tiles = jnp.where(valid[..., None], lhs[src], 0)  # [T, tile, K]
  out_tiles = jnp.einsum("tmk,tnk->tmn" if transpose_rhs else "tmk,tkn->tmn", lhs_tiles,
                         rhs[group_of_tile])  # [T, tile, N]
  # Row m of the result: its group, tile and position in the tile (a gather, so its transpose is a scatter-add).
  rows = jnp.arange(m, dtype=jnp.int32)
  group_of_row = jnp.minimum(_count_at_most(row_end, m), n_groups - 1)
  within = rows - row_start[group_of_row]
  tile_of_row = jnp.minimum(tile_start[group_of_row] + within // tile, n_tiles - 1)  # rows past Σ: masked below
  out = out_tiles[tile_of_row, within % tile]
  return jnp.where((rows < row_end[-1])[:, None], out, 0).astype(out_tiles.dtype)


def _tiled_tmatmul(lhs: Array, d_out: Array, group_sizes: Array, max_tile: int | None) -> Array:
  """`Σ_{m in g} lhs[m]ᵀ d_out[m]` → [G, K, N] float32: per tile `lhs_tileᵀ d_out_tile` [T, K, N] (float32
  accumulation), scatter-added into the tile's group. Padded rows are 0 in both operands; no [G, M] anything."""
  m, n_groups = lhs.shape[0], group_sizes.shape[0]
  _, group_of_tile, src, valid, _, _, _ = _tile_layout(group_sizes, m, max_tile)
  lhs_tiles = jnp.where(valid[..., None], lhs[src], 0)  # [T, tile, K]
  d_out_tiles = jnp.where(valid[..., None], d_out[src], 0)  # [T, tile, N]
  per_tile = jnp.einsum("tmk,tmn->tkn", lhs_tiles, d_out_tiles, preferred_element_type=jnp.float32)
  out = jnp.zeros((n_groups, lhs.shape[1], d_out.shape[1]), jnp.float32)
  return out.at[group_of_tile].add(per_tile)  # invalid tiles (past the last group) are all zero


def _count_at_most(ends: Array, n: int) -> Array:
  """`[#{g : ends[g] ≤ i} for i < n]` for non-decreasing ends [G] (= searchsorted(ends, arange(n), "right")) → [n]
  int32, as a histogram and a cumulative sum: O(n + G), and unlike jnp.searchsorted it traces inside shard_map."""
  return jnp.cumsum(jnp.zeros(n, jnp.int32).at[ends].add(1, mode="drop"), dtype=jnp.int32)


# ---------------------------------------------------------------------------------------------------------------
# Pallas megablox (TPU).

def _megablox():
  # The package's `gmm` attribute is ops.gmm (its custom_vjp); the kernels module (gmm, tgmm) by its full name.
  return importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")


def _megablox_tiling(m: int, k: int, n: int) -> tuple[int, int, int]:
  """Row tile a multiple of 128 (M is padded to it); contracting / output tiles the whole dimension when smaller
  than MaxText's 1024 (a block equal to the array's dimension is always a legal TPU block)."""
  tm, tk, tn = _MEGABLOX_TILING
  return min(tm, -(-m // 128) * 128), min(tk, k), min(tn, n)


def _pad_rows(x: Array, rows: int) -> Array:
  return x if x.shape[0] == rows else jnp.pad(x, ((0, rows - x.shape[0]), (0, 0)))


def _megablox_gmm(lhs: Array, rhs: Array, group_sizes: Array, transpose_rhs: bool, interpret: bool,
                  zero_tail: bool = True) -> Array:
  m, k = lhs.shape
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  if rhs.shape[0] == 0:
    return jnp.zeros((m, n), lhs.dtype)
  tiling = _megablox_tiling(m, k, n)
  padded = -(-m // tiling[0]) * tiling[0]  # the kernel needs M divisible by its row tile
  out = _megablox().gmm(_pad_rows(lhs, padded), rhs, group_sizes, preferred_element_type=lhs.dtype, tiling=tiling,
                        transpose_rhs=transpose_rhs, interpret=interpret)[:m]
  # The kernel never writes rows outside every group (their memory is uninitialised): zero them, unless the caller
  # ignores them (`zero_tail=False`).
  return jnp.where((jnp.arange(m) < jnp.sum(group_sizes))[:, None], out, 0) if zero_tail else out


def _megablox_tgmm(lhs: Array, d_out: Array, group_sizes: Array, dtype, interpret: bool) -> Array:
  m, k = lhs.shape
  n = d_out.shape[1]
  tiling = _megablox_tiling(m, k, n)
  padded = -(-m // tiling[0]) * tiling[0]
  # Rows past Σ group_sizes (the padding too) are masked inside the kernel; empty groups are written as 0.
  return _megablox().tgmm(_pad_rows(lhs, padded).swapaxes(0, 1), _pad_rows(d_out, padded), group_sizes,
                          preferred_element_type=dtype, tiling=tiling, interpret=interpret)
