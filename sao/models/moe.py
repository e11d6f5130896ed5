"""Routed, dropless mixture of experts: sort token→expert assignments by expert, grouped matmuls, un-sort, combine.

Router (float32, in `sao.models.layers.MoE`): `p = softmax(x @ gate)` over X experts, top-k, renormalised over the k
when `norm_topk_prob`. Experts: `y_n = Σ_{j<k} p_nj · down_e(silu(gate_e(x_n)) * up_e(x_n))` with `e = top_i[n, j]`.

`routed_experts` computes each token only with its k experts (FLOPs ∝ N·k, not N·X) and drops nothing (any number
of tokens may pick one expert):
  1. the N·k assignments are sorted by expert (stable argsort); row m of the sorted list is token `order[m] // k`;
  2. `group_sizes[e]` rows per expert, grouped matmuls `[M, D] × [X, D, F] → [M, F]` (`grouped_matmul`; the
     weights are stored `[X, F, D]`, HF's layout, and swapped at the call);
  3. the rows are un-sorted (the inverse permutation, a gather) to `[N, k, D]` and summed with the router weights.
`dense_experts` runs every expert on every token and weights the unselected ones by 0: the test oracle
(`ModelConfig.moe_impl = "dense"`).

Grouped matmul: `sao.models.grouped_matmul` (a custom VJP whose weight gradient is a transposed grouped matmul, not
ragged_dot's transpose, which XLA's TPU compiler makes dense over the experts): Pallas megablox kernels on TPU where
every mesh axis is manual, ragged_dot + a tiled weight gradient under GSPMD, tiles of one expert each on CPU; chosen
when lowering, so an ahead-of-time TPU compile from a CPU host gets the TPU kernels.

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

from sao.models.grouped_matmul import grouped_matmul

Array = jax.Array
EXPERT_AXIS = "expert"


def route(router_logits: Array, k: int, norm_topk_prob: bool) -> tuple[Array, Array]:
  """Top-k routing in float32: router_logits [N, X] → (weights [N, k] float32, experts [N, k] int32)."""
  probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
  weights, experts = jax.lax.top_k(probs, k)
  if norm_topk_prob:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  return weights, experts.astype(jnp.int32)


def dense_experts(x: Array, weights: Array, experts: Array, w_gate: Array, w_up: Array, w_down: Array) -> Array:
  """Every expert on every token (the oracle): x [N, D], weights / experts [N, k], w_gate / w_up [X, F, D],
  w_down [X, D, F] (HF's `[out, in]` per expert) → [N, D] in x.dtype."""
  n_exp = w_gate.shape[0]
  combine = jnp.sum(jax.nn.one_hot(experts, n_exp, dtype=jnp.float32) * weights[..., None], axis=-2)  # [N, X]
  combine = combine.astype(x.dtype)
  h = jax.nn.silu(jnp.einsum("ne,xie->nxi", x, w_gate.astype(x.dtype)))
  h = h * jnp.einsum("ne,xie->nxi", x, w_up.astype(x.dtype))
  return jnp.einsum("nxi,xei,nx->ne", h, w_down.astype(x.dtype), combine)


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
  # The weights are stored [X, out, in] (HF's layout); grouped_matmul takes rhs [G, in, out].
  h = jax.nn.silu(grouped_matmul(xs, w_gate.astype(x.dtype).swapaxes(1, 2), group_sizes))
  h = h * grouped_matmul(xs, w_up.astype(x.dtype).swapaxes(1, 2), group_sizes)
  # [M, D]; rows outside every group are not ours
  ys = grouped_matmul(h, w_down.astype(x.dtype).swapaxes(1, 2), group_sizes)
  ys = jnp.where(here[order][:, None], ys, 0)
  unsorted = ys[jnp.argsort(order)].reshape(n_tok, k, -1)  # inverse permutation: back to [N, k, D]
  return jnp.einsum("nkd,nk->nd", unsorted, weights.astype(x.dtype))
