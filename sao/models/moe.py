"""Routed, dropless mixture of experts: sort token→expert assignments by expert, grouped matmuls, un-sort, combine.

Router (float32, in `sao.models.layers.MoE`): `p = softmax(x @ gate)` over X experts, top-k, renormalised over the k
when `norm_topk_prob`. Experts: `y_n = Σ_{j<k} p_nj · down_e(silu(gate_e(x_n)) * up_e(x_n))` with `e = top_i[n, j]`.

Routing replay (`replay_route`, `learner.routing_replay`): the k experts of a token come from the inference engine's
record (SGLang's `routed_experts`, `sao.models.routed_experts`) instead of this router's top-k; the gates are still
this router's probabilities at those experts (renormalised when `norm_topk_prob`), as slime / Megatron replay them.

`routed_experts` computes each token only with its k experts (FLOPs ∝ N·k, not N·X) and drops nothing (any number
of tokens may pick one expert):
  1. the N·k assignments are sorted by expert (stable argsort); row m of the sorted list is token `order[m] // k`;
  2. `group_sizes[e]` rows per expert, grouped matmuls `[M, D] × [X, F, D]ᵀ → [M, F]` (`grouped_matmul` with
     `transpose_rhs`: the weights stay in HF's `[X, out, in]` layout, no per-call swapped copy);
  3. the rows are un-sorted (the inverse permutation, a gather) to `[N, k, D]` and summed with the router weights.
`dense_experts` runs every expert on every token and weights the unselected ones by 0: the test oracle
(`ModelConfig.moe_impl = "dense"`).

Grouped matmul: `sao.models.grouped_matmul` (a custom VJP whose weight gradient is a transposed grouped matmul, not
ragged_dot's transpose, which XLA's TPU compiler makes dense over the experts): Pallas megablox kernels on TPU where
every mesh axis is manual, ragged_dot + a tiled weight gradient under GSPMD, tiles of one expert each on CPU; chosen
when lowering, so an ahead-of-time TPU compile from a CPU host gets the TPU kernels.

Under a context mesh (`jax.set_mesh`, as the learner traces its steps) with more than one device, the experts run
in one `shard_map` manual over every mesh axis (`_mesh_experts`):
  - tokens: x [N, D] and the routing [N, k] split by rows over the batch axes (`data`, `fsdp`, `expert`: the
    learner's batch rule), so each shard sorts and gathers only its own N / (data·fsdp·expert) tokens — the sorted
    copies `[M_local, D]` are 1 / (data·fsdp·expert) of the whole micro-batch's (measured: inside the learner's
    scan over layers GSPMD had kept them whole, 32 GiB per chip at 131k tokens, docs/history.md, 2026-11-30);
  - expert weights: the stacked experts over `expert`, the expert width F over `tensor`, the hidden D gathered
    (what FSDP does with every layer's weights; the shard_map's in_spec inserts the all-gather, its transpose
    the reduce-scatter of the weight gradient);
  - expert parallelism (E = |expert| > 1): the tokens of the E shards of an expert group are all-gathered within
    the group, each shard runs its X/E experts on them (the other assignments sort after every local group), and the
    partial outputs are reduce-scattered back (`psum_scatter`); tensor parallelism: each shard's F/|tensor| slice
    gives a partial down projection, summed with `psum` over `tensor` — or, when the tokens' rows outnumber the
    weights' (`_tokens_over_tensor`: training micro-batches), `tensor` splits the tokens instead (a slice of rows
    each shard already holds; whole expert widths gathered over `tensor`), so the row-sized data movement is not
    repeated on every `tensor` shard.
  Chunks of a capacity (`ModelConfig.moe_capacity_factor` = c > 0, expert parallelism only): the gathered
    assignments are E·N·k rows of which ≈ 1/E are this shard's, and every row-sized array (the sorted copy, the
    un-sort, their transposes) costs HBM traffic for all of them (docs/history.md, "Lever 3"). With a
    capacity C = c·M/E (rounded up to 128 rows) a shard runs its sorted rows C at a time, gathered, multiplied (the
    router weight folded into the [C, F] activations) and scatter-added in x.dtype, over as many chunks as its own
    assignments fill (one when they fit in C): time follows the shard's own rows, memory C; nothing is dropped.
    Its backward (`_bounded_experts`, a custom VJP) keeps the inputs only and recomputes each chunk.
Why all-gather + reduce-scatter over `expert` and not all-to-all: dropless all-to-all needs either worst-case
static buffers (every token to one shard: E× the activations) or `ragged_all_to_all` (not on CPU, so not testable
here); the gather and the scatter move N·D per layer, and no buffer depends on how the router splits the tokens.
Every axis being manual lets `grouped_matmul`'s "auto" pick the Pallas megablox kernels when lowering for TPU
(Mosaic kernels cannot be partitioned by GSPMD); `check_vma=False` because their outputs carry no varying-axes
type — the transpose then psums each input's cotangent over the axes its in_spec does not name and divides the
output's by them, which is the right gradient for every input here (replicated inputs are used identically on each
shard, or their partial contributions are summed by the collectives above). A token count the batch shards do not
divide (a one-row forward on a batch-sharded mesh) keeps the tokens replicated: correct, each shard then does the
whole work. Without a context mesh, or on one device, the computation is written for one device (`_local_experts`)
and GSPMD partitions it as it can.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from sao.models.grouped_matmul import grouped_matmul
from sao.models.mesh_axes import BATCH_AXES, TENSOR_AXIS

Array = jax.Array
EXPERT_AXIS = "expert"


def route(router_logits: Array, k: int, norm_topk_prob: bool) -> tuple[Array, Array]:
  """Top-k routing in float32: router_logits [N, X] → (weights [N, k] float32, experts [N, k] int32)."""
  probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
  weights, experts = jax.lax.top_k(probs, k)
  if norm_topk_prob:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  return weights, experts.astype(jnp.int32)


def replay_route(router_logits: Array, replayed: Array, k: int, norm_topk_prob: bool) -> tuple[Array, Array]:
  """Routing replay (R3): the experts an inference engine chose, weighted by this router's probabilities.

  router_logits [N, X]; replayed [N, k] int32 expert ids in [0, X) (SGLang's `routed_experts` rows), where a row
  holding any negative id (−1: nothing recorded for that token, e.g. padding or a token the engine never fed)
  keeps this router's own top-k. → (weights [N, k] float32, experts [N, k] int32) with, per row,
    e = replayed if every replayed id >= 0 else top_k(p),   p = softmax(router_logits) (float32),
    w_j = p[e_j]  (/ Σ_j p[e_j] when norm_topk_prob).
  The gates are this router's (so its gradient flows through them, as without replay); only the choice of experts
  is the engine's -- what slime's and Megatron's routing replay do (`probs = scores.gather(1, top_indices)`; with
  Megatron's softmax over the k gathered logits when the top-k is renormalised, the same numbers). Valid ids are the
  caller's contract (the learner checks them on the host): an id >= X would be clamped by the gather."""
  own_weights, own_experts = route(router_logits, k, norm_topk_prob)
  if replayed.shape != own_experts.shape:
    raise ValueError(f"routed_experts: {replayed.shape} replayed ids for routing of shape {own_experts.shape}")
  use = jnp.all(replayed >= 0, axis=-1, keepdims=True)  # [N, 1]
  experts = jnp.where(use, replayed.astype(jnp.int32), own_experts)
  probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
  weights = jnp.take_along_axis(probs, experts, axis=-1, mode="clip")
  if norm_topk_prob:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  return jnp.where(use, weights, own_weights), experts


class SharedExpert(NamedTuple):
  """The shared expert's weights in HF's `[out, in]` layout: gate / up `[S, D]`, down `[D, S]`, and its sigmoid gate
  `[1, D]` (`shared_expert_gate`)."""
  w_gate: Array
  w_up: Array
  w_down: Array
  gate: Array


def shared_expert(x: Array, shared: SharedExpert) -> Array:
  """`sigmoid(x · gateᵀ) · down(silu(x · w_gateᵀ) * (x · w_upᵀ))`: x [N, D] → [N, D] in x.dtype (the sigmoid in
  float32), every token through the same small SwiGLU."""
  mm = lambda a, w: jnp.einsum("nd,sd->ns", a, w.astype(x.dtype))
  h = jax.nn.silu(mm(x, shared.w_gate)) * mm(x, shared.w_up)
  gate = jax.nn.sigmoid(mm(x, shared.gate).astype(jnp.float32)).astype(x.dtype)
  return gate * mm(h, shared.w_down)


def dense_experts(x: Array, weights: Array, experts: Array, w_gate: Array, w_up: Array, w_down: Array) -> Array:
  """Every expert on every token (the oracle): x [N, D], weights / experts [N, k], w_gate / w_up [X, F, D],
  w_down [X, D, F] (HF's `[out, in]` per expert) → [N, D] in x.dtype."""
  n_exp = w_gate.shape[0]
  combine = jnp.sum(jax.nn.one_hot(experts, n_exp, dtype=jnp.float32) * weights[..., None], axis=-2)  # [N, X]
  combine = combine.astype(x.dtype)
  h = jax.nn.silu(jnp.einsum("ne,xie->nxi", x, w_gate.astype(x.dtype)))
  h = h * jnp.einsum("ne,xie->nxi", x, w_up.astype(x.dtype))
  return jnp.einsum("nxi,xei,nx->ne", h, w_down.astype(x.dtype), combine)


def routed_experts(x: Array, weights: Array, experts: Array, w_gate: Array, w_up: Array, w_down: Array,
                   capacity_factor: float = 0.0, shared: SharedExpert | None = None,
                   sequence_parallel: bool = False) -> Array:
  """Routed, dropless experts (see the module docstring); same arguments and result as `dense_experts`.
  `capacity_factor` > 0: under expert parallelism, the capacity with a dropless fallback (module docstring).
  `shared`: the shared expert's output (`shared_expert`) is added, computed with the routed experts' layout of the
  tokens when `tensor` splits them (module docstring). `sequence_parallel`: the caller's rows are already split
  over `tensor` (`sao.models.sequence_parallel`) and the shard_map takes and returns them so: with whole expert
  widths each shard runs its own rows (no slice in, no all-gather out); with the widths split it all-gathers the
  rows over `tensor` on entry and reduce-scatters the partial outputs on exit."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1 or mesh.manual_axes:  # no mesh, one device, or a caller's shard_map lays it out
    out = _local_experts(x, weights, experts, w_gate, w_up, w_down, first_expert=0)
    return out if shared is None else out + shared_expert(x, shared)
  return _mesh_experts(mesh, x, weights, experts, w_gate, w_up, w_down, capacity_factor, shared, sequence_parallel)


def _axis_size(mesh, name: str) -> int:
  return mesh.shape[name] if name in mesh.axis_names else 1


def _mesh_experts(mesh, x: Array, weights: Array, experts: Array, w_gate: Array, w_up: Array,
                  w_down: Array, capacity_factor: float = 0.0, shared: SharedExpert | None = None,
                  sequence_parallel: bool = False) -> Array:
  """`routed_experts` in one shard_map manual over every axis of `mesh` (the module docstring): x [N, D] and the
  routing [N, k] by rows over the batch axes, w_gate / w_up [X, F, D] and w_down [X, D, F] (HF's `[out, in]`) by
  experts over `expert` and F over `tensor` → [N, D], rows over the batch axes. When `_tokens_over_tensor`, each
  `tensor` shard runs 1/|tensor| of its rows with the experts' whole widths (gathered inside) instead."""
  n_exp, n_width = w_gate.shape[0], w_gate.shape[1]
  n_expert_shards = _axis_size(mesh, EXPERT_AXIS)
  if n_exp % n_expert_shards:
    raise ValueError(f"num_experts: {n_exp} experts do not split over the {n_expert_shards}-way `{EXPERT_AXIS}` "
                     "mesh axis")
  token_axes = tuple(a for a in BATCH_AXES if _axis_size(mesh, a) > 1)
  if x.shape[0] % math.prod(_axis_size(mesh, a) for a in token_axes):
    token_axes = ()  # tokens replicated (see the module docstring)
  width_axis = TENSOR_AXIS if _axis_size(mesh, TENSOR_AXIS) > 1 and n_width % mesh.shape[TENSOR_AXIS] == 0 else None
  whole_width = width_axis is not None and _tokens_over_tensor(mesh, token_axes, x.shape[0], experts.shape[1],
                                                                 n_exp, n_width)
  hidden_axis = None  # whole widths: the weights enter as stored (F over `tensor`, D over `fsdp`), gathered inside
  if whole_width:
    width_axis = None
    fsdp = _axis_size(mesh, "fsdp")
    hidden_axis = "fsdp" if fsdp > 1 and x.shape[1] % fsdp == 0 else None
  expert_axis = EXPERT_AXIS if n_expert_shards > 1 else None
  gather_tokens = expert_axis is not None and expert_axis in token_axes
  # Sequence parallelism: the rows arrive split over `tensor` and leave so. With whole widths each shard runs its own
  # rows; with F split over `tensor` the shard all-gathers the rows over `tensor` on entry and reduce-scatters its
  # partial outputs on exit (Megatron's sequence parallelism), the shared expert on its own rows with whole weights.
  tensor = _axis_size(mesh, TENSOR_AXIS)
  rows_split = (sequence_parallel and tensor > 1
                and x.shape[0] % (math.prod(_axis_size(mesh, a) for a in token_axes) * tensor) == 0)

  def gather_weight(w, width_dim, hidden_dim):
    # An all-gather inside the shard_map transposes to a reduce-scatter of the weight gradient (GSPMD's gather before
    # it came back as an all-reduce of the whole local experts' gradients).
    w = jax.lax.all_gather(w, TENSOR_AXIS, axis=width_dim, tiled=True)
    return w if hidden_axis is None else jax.lax.all_gather(w, hidden_axis, axis=hidden_dim, tiled=True)

  def per_shard(x, weights, experts, w_gate, w_up, w_down, *shared_weights):
    first = 0 if expert_axis is None else jax.lax.axis_index(expert_axis) * (n_exp // n_expert_shards)
    shared_out = None
    own_rows = x.shape[0]
    if rows_split and not whole_width:
      if shared_weights:
        shared_out = shared_expert(x, SharedExpert(*shared_weights))
      x, weights, experts = (jax.lax.all_gather(a, TENSOR_AXIS, tiled=True) for a in (x, weights, experts))
    if whole_width:
      w_gate, w_up, w_down = gather_weight(w_gate, 1, 2), gather_weight(w_up, 1, 2), gather_weight(w_down, 2, 1)
      if not rows_split:
        # This `tensor` shard's part of the rows it holds (the shard_map's boundary keeps GSPMD's layout, rows
        # replicated over `tensor`: a slice here, an all-gather at the end, and no resharding around the block).
        part = x.shape[0] // mesh.shape[TENSOR_AXIS]
        start = jax.lax.axis_index(TENSOR_AXIS) * part
        x, weights, experts = (jax.lax.dynamic_slice_in_dim(a, start, part) for a in (x, weights, experts))
      if shared_weights:  # the shared expert on the same part of the rows, its (small) weights whole
        shared_out = shared_expert(x, SharedExpert(*shared_weights))
    if gather_tokens:  # the expert group's tokens: [N_local · E, ...]
      x, weights, experts = (jax.lax.all_gather(a, expert_axis, tiled=True) for a in (x, weights, experts))
    rows = experts.shape[0] * experts.shape[1]
    capacity = (expert_capacity(rows, n_expert_shards, capacity_factor) if expert_axis is not None
                and capacity_factor > 0 else None)
    out = _local_experts(x, weights, experts, w_gate, w_up, w_down, first_expert=first, capacity=capacity)
    if gather_tokens:
      out = jax.lax.psum_scatter(out, expert_axis, scatter_dimension=0, tiled=True)
    elif expert_axis is not None:
      out = jax.lax.psum(out, expert_axis)
    if whole_width:
      out = out if shared_out is None else out + shared_out
      return out if rows_split else jax.lax.all_gather(out, TENSOR_AXIS, tiled=True)
    if rows_split:
      if width_axis is not None:
        out = jax.lax.psum_scatter(out, TENSOR_AXIS, scatter_dimension=0, tiled=True)
      else:
        out = jax.lax.dynamic_slice_in_dim(out, jax.lax.axis_index(TENSOR_AXIS) * own_rows, own_rows)
      return out if shared_out is None else out + shared_out
    return jax.lax.psum(out, width_axis) if width_axis is not None else out

  rows = P((*token_axes, TENSOR_AXIS)) if rows_split else P(token_axes or None)
  if whole_width:
    w_in, w_out = P(expert_axis, TENSOR_AXIS, hidden_axis), P(expert_axis, hidden_axis, TENSOR_AXIS)
  else:
    w_in, w_out = P(expert_axis, width_axis, None), P(expert_axis, None, width_axis)
  # The shared expert rides along only where `tensor` splits the tokens (or they arrive split); its weights enter
  # whole (a few MB: GSPMD gathers them, and their gradient is summed over the shards).
  inside = tuple(shared) if shared is not None and (whole_width or rows_split) else ()
  out = jax.shard_map(per_shard, mesh=mesh, in_specs=(rows, rows, rows, w_in, w_in, w_out) + (P(),) * len(inside),
                      out_specs=rows, axis_names=set(mesh.axis_names), check_vma=False)(
                          x, weights, experts, w_gate, w_up, w_down, *inside)
  return out + shared_expert(x, shared) if shared is not None and not inside else out


def _tokens_over_tensor(mesh, token_axes: tuple[str, ...], n_tokens: int, k: int, n_exp: int,
                        n_width: int) -> bool:
  """Whether the `tensor` shards take different tokens (each with whole expert widths) rather than the same tokens
  with F / |tensor| each: by the rows each layout moves per shard. Splitting F makes every `tensor` shard gather,
  sort, multiply and scatter the same N_local·E·k sorted assignment rows of D (with the expert all-gather, the
  largest data movement of a training step, repeated on every `tensor` shard); splitting the tokens instead gathers
  each shard's X/E experts' whole widths over `tensor`, 3·(X/E)·F rows of D. The tokens take `tensor` when the
  assignment rows outnumber the weights' (training micro-batches: 2,097,152 against 49,152 at T = 32,768 on the
  v5p-128 expert mesh; 1,048,576 against 393,216 at 131,072 on the `full` configs' mesh, docs/tpu_hlo_breakdown.md)
  and split evenly; decoding's few tokens keep F split."""
  tensor = mesh.shape[TENSOR_AXIS]
  batch_shards = math.prod(_axis_size(mesh, a) for a in token_axes)
  if not token_axes or n_tokens % (batch_shards * tensor):
    return False
  gathered = n_tokens // batch_shards * _axis_size(mesh, EXPERT_AXIS)
  return gathered * k > 3 * (n_exp // _axis_size(mesh, EXPERT_AXIS)) * n_width


def expert_capacity(rows: int, expert_shards: int, capacity_factor: float) -> int:
  """Rows of a shard's chunk: capacity_factor × its balanced share of the `rows` assignments it
  receives, rounded up to 128 and at most `rows`."""
  if capacity_factor <= 0:
    raise ValueError(f"moe_capacity_factor: {capacity_factor} is not > 0")
  return min(rows, -(-math.ceil(capacity_factor * rows / expert_shards) // 128) * 128)


def _local_experts(x: Array, weights: Array, experts: Array, w_gate: Array, w_up: Array, w_down: Array,
                   first_expert: Array | int, capacity: int | None = None) -> Array:
  """The experts `first_expert ... first_expert + X_local − 1` (the X_local = w_gate.shape[0] held here) applied to
  their assignments among x [N, D]; other assignments contribute 0. → [N, D]. `capacity`: the chunk's rows
  (`_bounded_experts`: the rows in chunks of it); None: every row at once."""
  n_tok, k = experts.shape
  n_local = w_gate.shape[0]
  local = experts.reshape(-1) - first_expert  # [N·k]
  here = (local >= 0) & (local < n_local)
  key = jnp.where(here, local, n_local)  # other shards' assignments sort after every local group
  order = jnp.argsort(key, stable=True)  # [M = N·k]
  group_sizes = jnp.bincount(key, length=n_local + 1)[:n_local].astype(jnp.int32)  # [X_local]
  # Gate and up as one [X, 2F, D] operand: one grouped matmul reads the sorted rows once, and its transpose gives one
  # d_rows instead of two [M, D] cotangents summed (the concatenation is weight-sized, X·2F·D, not row-sized).
  w_gate_up = jnp.concatenate([w_gate, w_up], axis=1)
  if capacity is None or capacity >= n_tok * k:
    return _all_rows(x, weights, order, group_sizes, w_gate_up, w_down)
  return _bounded_experts(x, weights, order, group_sizes, w_gate_up, w_down, capacity)


def _expert_mlp(xs: Array, group_sizes: Array, w_gate_up: Array, w_down: Array,
                row_scale: Array | None = None, zero_tail: bool = True) -> Array:
  """SwiGLU of the sorted rows xs [R, D] with their groups' experts (w_gate_up [X, 2F, D]: gate then up, w_down
  [X, D, F]) → [R, D]; rows past Σ group_sizes are 0, or undefined without `zero_tail` (the caller drops them:
  `grouped_matmul`). `row_scale` [R]: each row's result times it, applied to the [R, F] activations before the down
  projection (linear in them) instead of to the [R, D] result."""
  width = w_down.shape[2]
  # The weights are stored [X, out, in] (HF's layout): grouped_matmul reads them transposed, no swapped copy.
  gate_up = grouped_matmul(xs, w_gate_up.astype(xs.dtype), group_sizes, transpose_rhs=True,
                           zero_tail=zero_tail)  # [R, 2F]
  h = jax.nn.silu(gate_up[:, :width]) * gate_up[:, width:]
  if row_scale is not None:
    h = h * row_scale[:, None].astype(h.dtype)
  # The rows outside every group (other shards' assignments, sorted last) come out exactly 0: `grouped_matmul`
  # zeroes the rows past Σ group_sizes, so no [R, D] select is needed.
  return grouped_matmul(h, w_down.astype(xs.dtype), group_sizes, transpose_rhs=True, zero_tail=zero_tail)


def _all_rows(x: Array, weights: Array, order: Array, group_sizes: Array, w_gate_up: Array, w_down: Array) -> Array:
  """Every one of the M = N·k sorted assignments: gathered [M, D], the experts, un-sorted to [N, k, D] (the inverse
  permutation, a gather) and summed with the router weights → [N, D]."""
  n_tok, k = weights.shape
  ys = _expert_mlp(x[order // k], group_sizes, w_gate_up, w_down)  # [M, D]
  unsorted = ys[jnp.argsort(order)].reshape(n_tok, k, -1)  # back to [N, k, D]
  return jnp.einsum("nkd,nk->nd", unsorted, weights.astype(x.dtype))


def _window(order: Array, group_sizes: Array, start: Array, capacity: int) -> tuple[Array, Array]:
  """The sorted assignments `start … start + C − 1` of `order` (padded to whole chunks): (their flat indices [C]
  into the N·k assignments, each group's rows inside the window [X_local])."""
  take = jax.lax.dynamic_slice_in_dim(order, start, capacity)  # [C]
  ends = jnp.cumsum(group_sizes)
  window = jnp.clip(ends, start, start + capacity) - jnp.clip(ends - group_sizes, start, start + capacity)
  return take, window.astype(jnp.int32)


def _chunks(order: Array, group_sizes: Array, capacity: int) -> tuple[Array, Array]:
  """(order padded to whole chunks of `capacity`, the number of chunks this shard's Σ group_sizes rows need)."""
  padded = -(-order.shape[0] // capacity) * capacity
  order = jnp.pad(order, (0, padded - order.shape[0]))  # padding rows sort past every group: they add 0
  return order, (jnp.sum(group_sizes) + capacity - 1) // capacity


def _kept(index: Array, window: Array, size: int) -> Array:
  """`index` [C] of a chunk's sorted rows, with the rows past its groups' Σ window sent out of bounds (`size`), so
  that a scatter with mode="drop" skips them."""
  return jnp.where(jnp.arange(index.shape[0]) < jnp.sum(window), index, size)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _bounded_experts(x: Array, weights: Array, order: Array, group_sizes: Array, w_gate_up: Array, w_down: Array,
                     capacity: int) -> Array:
  """`_all_rows`' value, computed `capacity` sorted rows at a time over as many chunks as this shard's assignments
  fill (one when they fit): time ∝ the shard's own rows, memory ∝ `capacity`.

  Per chunk: the rows gathered [C, D], the experts with the router weight folded into the [C, F] activations, and
  the [C, D] result scatter-added into the output (the chunk's rows past its groups — other shards' assignments,
  padding — are dropped from the scatter rather than zeroed by a [C, ·] select after every grouped matmul), which is accumulated in x.dtype. Why not float32: a token
  receives at most k additions on a shard (k/E on average under balanced routing), each rounded once — what the
  every-row path's bf16 combine and the `expert`-axis psum_scatter of bf16 partials after it round too — while a
  float32 accumulator made every [C, D] update and the [N, D] output twice as many bytes (the largest temporaries of
  the expert-parallel step, docs/tpu_hlo_breakdown.md "The MoE's data movement")."""
  order, n_chunks = _chunks(order, group_sizes, capacity)
  gates = weights.reshape(-1)
  k = weights.shape[1]

  def body(i, out):
    take, window = _window(order, group_sizes, i * capacity, capacity)
    token = take // k
    ys = _expert_mlp(x[token], window, w_gate_up, w_down, row_scale=gates[take], zero_tail=False)
    return out.at[_kept(token, window, x.shape[0])].add(ys, mode="drop")

  return jax.lax.fori_loop(0, n_chunks, body, jnp.zeros(x.shape, x.dtype))


def _bounded_experts_fwd(x, weights, order, group_sizes, w_gate_up, w_down, capacity):
  out = _bounded_experts(x, weights, order, group_sizes, w_gate_up, w_down, capacity)
  return out, (x, weights, order, group_sizes, w_gate_up, w_down)


def _bounded_experts_bwd(capacity, residuals, d_out):
  """The VJP chunk by chunk, each chunk's experts recomputed from the gathered rows (a loop with a data-dependent trip
  count has no reverse-mode derivative of its own, and no chunk's residuals outlive it): d_out gathered [C, D] (in
  its dtype), the chunk's VJP with respect to its rows, gates and weights, d_rows scatter-added into d_x (x.dtype, as
  the forward's output) and d_gates into the N·k router weights. The weight gradients accumulate in float32."""
  x, weights, order, group_sizes, w_gate_up, w_down = residuals
  padded, n_chunks = _chunks(order, group_sizes, capacity)
  gates = weights.reshape(-1)
  k = weights.shape[1]

  def body(i, acc):
    d_x, d_gates, d_gate_up, d_down = acc
    take, window = _window(padded, group_sizes, i * capacity, capacity)
    token = take // k
    mlp = lambda rows, scale, w_gu, w_d: _expert_mlp(rows, window, w_gu, w_d, row_scale=scale, zero_tail=False)
    _, pullback = jax.vjp(mlp, x[token], gates[take], w_gate_up, w_down)
    g_rows, g_scale, g_gate_up, g_down = pullback(d_out[token].astype(x.dtype))
    # Rows past the chunk's groups hold undefined values (`zero_tail=False`): dropped from both scatters.
    return (d_x.at[_kept(token, window, x.shape[0])].add(g_rows.astype(x.dtype), mode="drop"),
            d_gates.at[_kept(take, window, gates.shape[0])].add(g_scale.astype(jnp.float32), mode="drop"),
            d_gate_up + g_gate_up.astype(jnp.float32), d_down + g_down.astype(jnp.float32))

  init = (jnp.zeros(x.shape, x.dtype), jnp.zeros(gates.shape, jnp.float32),
          jnp.zeros(w_gate_up.shape, jnp.float32), jnp.zeros(w_down.shape, jnp.float32))
  d_x, d_gates, d_gate_up, d_down = jax.lax.fori_loop(0, n_chunks, body, init)
  return (d_x, d_gates.reshape(weights.shape).astype(weights.dtype), None, None,
          d_gate_up.astype(w_gate_up.dtype), d_down.astype(w_down.dtype))


_bounded_experts.defvjp(_bounded_experts_fwd, _bounded_experts_bwd)
