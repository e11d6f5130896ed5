"""Sequence parallelism over `tensor` (`ModelConfig.sequence_parallel`): the tokens, not the hidden units, split.

Tensor parallelism as the `full` configs first ran it keeps the residual stream [B, T, E] with E over `tensor` and
splits every projection by heads: each layer's attention or Gated DeltaNet all-gathers its whole input [B, T, E]
over `tensor` and reduce-scatters its output's partial sums, in the forward, the recomputation and the backward.
At T = 131,072 on a v5p-128 (`tensor` 16) those row-sized collectives were 23.8 of the actor step's 43.0 s
(docs/tpu_hlo_breakdown.md). With `sequence_parallel` the residual stream is [B, T, E] with T over `tensor`:

  - a projection multiplies the chip's own tokens by the whole weight (the weight, a few MB, is all-gathered over
    `tensor`, and its gradient reduce-scattered: `split_tokens` on the projection's output forces that layout);
  - the mixers need the whole sequence of a head, so their inputs move from tokens to heads over `tensor` and their
    outputs back (`split_heads` then `split_tokens`: one all-to-all each way, 1/|tensor| of the rows' bytes per chip
    where the all-gather moved all of them) — DeepSpeed-Ulysses' layout, GSPMD inserting the all-to-alls;
  - norms, gates and the MoE run on the chip's own tokens, with no collective (the MoE's shard_map takes its rows
    over the batch axes and `tensor`: `sao.models.moe`).

The constraints are the identity without a context mesh, with `tensor` of size 1 or manual, or where `tensor` does
not divide the dim (a decode step's one token keeps its layout).
"""
from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P

from sao.models.mesh_axes import BATCH_AXES, TENSOR_AXIS, constrainable_axes, logical_mesh_axes

Array = jax.Array

# Rows as the `batch` rule of `sao.models.sharding`; the split dim over `tensor` (also `scan.shard_residual`'s rule).
SPLIT_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (("batch", BATCH_AXES), ("split", (TENSOR_AXIS,)))


def _constrain(x: Array, split_dim: int) -> Array:
  """x with dim 0 over the batch axes and `split_dim` over `tensor` of the context mesh (the shared rule
  `mesh_axes.logical_mesh_axes` drops what the mesh lacks or what does not divide); the identity when `tensor`
  does not take `split_dim`."""
  axes = constrainable_axes(jax.sharding.get_abstract_mesh())
  names = ["batch"] + [None] * (x.ndim - 1)
  names[split_dim] = "split"
  spec = logical_mesh_axes(names, x.shape, axes, SPLIT_RULES)
  if spec[split_dim] is None:
    return x
  return jax.lax.with_sharding_constraint(x, P(*spec))


def split_dim(x: Array, dim: int) -> Array:
  """x [B, ...]: B over the batch axes, `dim` over `tensor` (the identity where `tensor` cannot take it)."""
  return _constrain(x, dim)


def split_tokens(x: Array) -> Array:
  """x [B, T, ...]: B over the batch axes, T over `tensor` (the module docstring)."""
  return _constrain(x, 1)


def split_heads(x: Array) -> Array:
  """x [B, T, H, ...] (or [B, T, C] for channels of whole heads): B over the batch axes, dim 2 over `tensor`, T
  whole (the module docstring)."""
  return _constrain(x, 2)
