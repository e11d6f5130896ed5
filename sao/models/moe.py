"""Routed, dropless mixture of experts: sort token→expert assignments by expert, grouped matmuls, un-sort, combine.

Router (float32, in `sao.models.layers.MoE`): `p = softmax(x @ gate)` over X experts, top-k, renormalised over the k
when `norm_topk_prob`. Experts: `y_n = Σ_{j<k} p_nj · down_e(silu(gate_e(x_n)) * up_e(x_n))` with `e = top_i[n, j]`.

`routed_experts` computes each token only with its k experts (FLOPs ∝ N·k, not N·X) and drops nothing (any number
of tokens may pick one expert):
  1. the N·k assignments are sorted by expert (stable argsort); row m of the sorted list is token `order[m] // k`;
  2. `group_sizes[e]` rows per expert, grouped matmuls `[M, D] × [X, D, F] → [M, F]` (`grouped_matmul`);
  3. the rows are un-sorted (the inverse permutation, a gather) to `[N, k, D]` and summed with the router weights.
`dense_experts` runs every expert on every token and weights the unselected ones by 0: the test oracle
(`ModelConfig.moe_impl = "dense"`).

Grouped matmul: `jax.lax.ragged_dot` on TPU / GPU (XLA's grouped-matmul path). On CPU jax lowers ragged_dot to a
masked dense dot over all groups (G × the FLOPs, measured with `cost_analysis()`), so CPU uses `_tiled_matmul`:
each group padded to tiles of `tile` rows, one gathered expert weight per tile, a batched matmul; at most
`M + G·(tile−1)` rows computed. The choice is `lax.platform_dependent`, resolved at lowering, so an ahead-of-time
TPU compile from a CPU host gets ragged_dot.

Expert parallelism (mesh axis `expert`, size E > 1, in the context mesh of `jax.set_mesh`): a `shard_map` manual
over `expert` only (other axes stay with GSPMD). Each shard receives all N tokens of its expert group (an all-gather
of the activations within the expert axis, inserted by the replicated in_spec) and its X/E experts' weights; it
sorts the assignments with its own experts first (others to the end, outside every group), runs the grouped matmuls
on its local groups, and the partial outputs are summed with `psum` over `expert`. Why all-gather + psum and not
all-to-all: dropless all-to-all needs either worst-case static buffers (every token to one shard: E× the
activations) or `ragged_all_to_all` (not on CPU, so not testable here); the all-gather and the all-reduce move N·D
per layer (131k tokens × D = 2048: 2.7e8 elements, against 8e8 expert parameters in a Qwen3.5-35B-A3B layer), and
no buffer depends on how the router splits the tokens. Not measured on TPU (no TPU here). Without a
context mesh (or E = 1) the computation is written for one device and GSPMD partitions it: correct (tested on
expert-sharded weights), but the expert weights may be all-gathered instead of the tokens.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

Array = jax.Array
EXPERT_AXIS = "expert"
_MAX_TILE = 128


def route(router_logits: Array, k: int, norm_topk_prob: bool) -> tuple[Array, Array]:
  """Top-k routing in float32: router_logits [N, X] → (weights [N, k] float32, experts [N, k] int32)."""
  probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
  weights, experts = jax.lax.top_k(probs, k)
  if norm_topk_prob:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  return weights, experts.astype(jnp.int32)


def dense_experts(x: Array, weights: Array, experts: Array, w_gate: Array, w_up: Array, w_down: Array) -> Array:
  """Every expert on every token (the oracle): x [N, D], weights / experts [N, k], w_gate / w_up [X, D, F],
  w_down [X, F, D] → [N, D] in x.dtype."""
  n_exp = w_gate.shape[0]
  combine = jnp.sum(jax.nn.one_hot(experts, n_exp, dtype=jnp.float32) * weights[..., None], axis=-2)  # [N, X]
  combine = combine.astype(x.dtype)
  h = jax.nn.silu(jnp.einsum("ne,xei->nxi", x, w_gate.astype(x.dtype)))
  h = h * jnp.einsum("ne,xei->nxi", x, w_up.astype(x.dtype))
  return jnp.einsum("nxi,xie,nx->ne", h, w_down.astype(x.dtype), combine)


def routed_experts(x: Array, weights: Array, experts: Array, w_gate: Array, w_up: Array, w_down: Array) -> Array:
  """Routed, dropless experts (see the module docstring); same arguments and result as `dense_experts`."""
  n_exp = w_gate.shape[0]
  mesh = jax.sharding.get_abstract_mesh()
  shards = 1 if mesh.empty or EXPERT_AXIS not in mesh.axis_names else mesh.shape[EXPERT_AXIS]
  if shards == 1:
    return _local_experts(x, weights, experts, w_gate, w_up, w_down, first_expert=0)
  if n_exp % shards:
    raise ValueError(f"num_experts: {n_exp} experts do not split over the {shards}-way `{EXPERT_AXIS}` mesh axis")

  def per_shard(x, weights, experts, w_gate, w_up, w_down):
    first = jax.lax.axis_index(EXPERT_AXIS) * (n_exp // shards)
    # x is replicated over `expert` but gathered with shard-dependent indices; marking it varying makes its
    # cotangent a psum over the shards (measured: without it, jax 0.10.2 returns a wrong gradient of x).
    x = jax.lax.pcast(x, EXPERT_AXIS, to="varying")
    partial_out = _local_experts(x, weights, experts, w_gate, w_up, w_down, first_expert=first)
    return jax.lax.psum(partial_out, EXPERT_AXIS)

  sharded = P(EXPERT_AXIS)
  return jax.shard_map(per_shard, mesh=mesh, in_specs=(P(), P(), P(), sharded, sharded, sharded), out_specs=P(),
                       axis_names={EXPERT_AXIS})(x, weights, experts, w_gate, w_up, w_down)


def _local_experts(x: Array, weights: Array, experts: Array, w_gate: Array, w_up: Array, w_down: Array,
                   first_expert: Array | int) -> Array:
  """The experts `first_expert ... first_expert + X_local − 1` (the X_local = w_gate.shape[0] held here) applied to
  their assignments among x [N, D]; other assignments contribute 0. → [N, D]."""
  n_tok, k = experts.shape
  n_local = w_gate.shape[0]
  local = experts.reshape(-1) - first_expert  # [N·k]
  here = (local >= 0) & (local < n_local)
  key = jnp.where(here, local, n_local)  # other shards' assignments sort after every local group
  order = jnp.argsort(key, stable=True)  # [M = N·k]
  group_sizes = jnp.bincount(key, length=n_local + 1)[:n_local].astype(jnp.int32)  # [X_local]
  xs = x[order // k]  # [M, D]
  h = jax.nn.silu(grouped_matmul(xs, w_gate.astype(x.dtype), group_sizes))
  h = h * grouped_matmul(xs, w_up.astype(x.dtype), group_sizes)
  ys = grouped_matmul(h, w_down.astype(x.dtype), group_sizes)  # [M, D]; rows outside every group are not ours
  ys = jnp.where(here[order][:, None], ys, 0)
  unsorted = ys[jnp.argsort(order)].reshape(n_tok, k, -1)  # inverse permutation: back to [N, k, D]
  return jnp.einsum("nkd,nk->nd", unsorted, weights.astype(x.dtype))


def grouped_matmul(lhs: Array, rhs: Array, group_sizes: Array, impl: str = "auto") -> Array:
  """`out[m] = lhs[m] @ rhs[g(m)]` where rows are grouped consecutively, `group_sizes[g]` rows for group g.

  lhs [M, K], rhs [G, K, N], group_sizes [G] int32 with Σ ≤ M → [M, N]; rows past Σ group_sizes are 0.
  impl: "ragged_dot" (`jax.lax.ragged_dot`), "tiled" (`_tiled_matmul`), "auto" (tiled on CPU, ragged_dot
  elsewhere, chosen when lowering).
  """
  if impl == "ragged_dot":
    return jax.lax.ragged_dot(lhs, rhs, group_sizes)
  if impl == "tiled":
    return _tiled_matmul(lhs, rhs, group_sizes)
  if impl != "auto":
    raise ValueError(f"impl: unsupported {impl!r}; expected 'auto', 'ragged_dot' or 'tiled'")
  return jax.lax.platform_dependent(lhs, rhs, group_sizes, cpu=_tiled_matmul, default=jax.lax.ragged_dot)


def _tiled_matmul(lhs: Array, rhs: Array, group_sizes: Array) -> Array:
  """Grouped matmul as a batched matmul over tiles of `tile` rows, each tile inside one group (zero-padded).

  `tile = clip(M // G, 1, 128)` (static), so at most `T = (M + G·(tile−1)) // tile` tiles exist and the padding is at
  most G·(tile−1) ≤ M rows: FLOPs ≤ 2·(2·M·K·N), and the gathered weights `[T, K, N]` are at most ~2× rhs.
  """
  m, n_groups = lhs.shape[0], rhs.shape[0]
  tile = max(1, min(_MAX_TILE, m // n_groups))
  n_tiles = max(1, (m + n_groups * (tile - 1)) // tile)
  group_sizes = group_sizes.astype(jnp.int32)
  tiles_per_group = -(-group_sizes // tile)
  tile_end = jnp.cumsum(tiles_per_group)
  tile_start = tile_end - tiles_per_group
  row_end = jnp.cumsum(group_sizes)
  row_start = row_end - group_sizes

  # Tile t holds rows row_start[g] + (t − tile_start[g])·tile + r, r < tile, of group g = group_of_tile[t].
  t = jnp.arange(n_tiles, dtype=jnp.int32)
  group_of_tile = jnp.minimum(_count_at_most(tile_end, n_tiles), n_groups - 1)
  offset = (t - tile_start[group_of_tile])[:, None] * tile + jnp.arange(tile, dtype=jnp.int32)[None, :]  # [T, tile]
  valid = (t < tile_end[-1])[:, None] & (offset < group_sizes[group_of_tile][:, None])
  src = jnp.where(valid, row_start[group_of_tile][:, None] + offset, 0)
  lhs_tiles = jnp.where(valid[..., None], lhs[src], 0)  # [T, tile, K]
  out_tiles = jnp.einsum("tmk,tkn->tmn", lhs_tiles, rhs[group_of_tile])  # [T, tile, N]

  # Row m of the result: its group, tile and position in the tile (a gather, so the backward pass is a scatter-add).
  rows = jnp.arange(m, dtype=jnp.int32)
  group_of_row = jnp.minimum(_count_at_most(row_end, m), n_groups - 1)
  within = rows - row_start[group_of_row]
  tile_of_row = jnp.minimum(tile_start[group_of_row] + within // tile, n_tiles - 1)  # rows past Σ: masked below
  out = out_tiles[tile_of_row, within % tile]
  return jnp.where((rows < row_end[-1])[:, None], out, 0).astype(out_tiles.dtype)


def _count_at_most(ends: Array, n: int) -> Array:
  """`[#{g : ends[g] ≤ i} for i < n]` for non-decreasing ends [G] (= searchsorted(ends, arange(n), "right")) → [n]
  int32, as a histogram and a cumulative sum: O(n + G), and unlike jnp.searchsorted it traces inside shard_map."""
  return jnp.cumsum(jnp.zeros(n, jnp.int32).at[ends].add(1, mode="drop"), dtype=jnp.int32)
