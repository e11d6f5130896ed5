"""Scan over decoder layers as a forward-time transformation of the per-layer parameter tree.

The parameter tree keeps one dict per layer (`layers_0`, `layers_1`, ...: HF name mapping, streaming loads, exports,
checkpoints and frozen-parameter regexes see no difference). When `ModelConfig.scan_layers` is set, the forward pass
groups the layers by the repeating period P of their kinds (block type and MLP kind: P = 4 for Qwen3.5's
[3 × Gated DeltaNet, 1 × attention], P = 1 for Qwen3), stacks the params of layers `j, j + P, j + 2P, ...` along a
new leading axis for each period position j, and runs `jax.lax.scan` over the N = ⌊L / P⌋ periods, the body applying
P layers in order. XLA then compiles one period's layers (and their backward) once, whatever the depth. The
L − N·P layers that do not fill a period run unrolled after the scan. Gradients reach the per-layer tree through the
stack (its transpose slices the stacked cotangent back into layers).

Cost: the stacked copy of the layer params (one extra copy in the param dtype, made each step) and, in the backward
pass, the stacked gradient before it is sliced back.

The residual stream between layers (`shard_residual`): under a context mesh (`jax.set_mesh`, as the learner traces its
steps) whose `tensor` axis is automatic and larger than 1, every layer's input x [B, T, E] is constrained to B over the
batch axes (`data`, `fsdp`, `expert`, those dividing B) and E over `tensor`. These inputs are what the per-layer remat
saves for the backward pass (stacked [N, B, T, E] per period position by the scan) and what the carry's cotangent is;
without the constraint XLA kept them whole over `tensor` (every tensor chip holding the same copy: 4 × 5 GiB per chip
for Qwen3.5-35B-A3B at T = 131,072, docs/history.md, 2026-12-01). The hidden dim rather than the sequence: each layer
opens with an RMSNorm over E (a partial sum and an all-reduce of [B, T] when E is split) and ends with the
`tensor`-sharded output projections' partial sums (a reduce-scatter onto E), while every mixer (attention, Gated
DeltaNet's chunked recurrence and causal conv) needs the whole sequence; the MoE's shard_map takes its tokens by rows
over the batch axes and E whole, an all-gather over `tensor` either way. Without a mesh, on one device, or with `tensor`
of size 1 / manual / not dividing E, it is the identity (CPU toy, engines).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from sao.models.config import ModelConfig
from sao.models.sequence_parallel import SPLIT_RULES, split_dim, split_tokens

Array = jax.Array
# (layer params, hidden [B, T, E]) → hidden [B, T, E]: one decoder layer applied functionally.
LayerFn = Callable[[Any, Array], Array]


def layer_kind(config: ModelConfig, i: int) -> tuple[str, bool]:
  """What fixes layer i's computation and param tree: (block type, is MoE)."""
  return config.layer_types[i], config.is_moe_layer(i)


def layer_period(config: ModelConfig) -> int:
  """The smallest P with `kind(i) == kind(i mod P)` for every layer i < L (L itself when the kinds never repeat)."""
  kinds = [layer_kind(config, i) for i in range(config.num_layers)]
  for period in range(1, config.num_layers + 1):
    if all(kinds[i] == kinds[i % period] for i in range(config.num_layers)):
      return period
  raise AssertionError("unreachable: P = L always satisfies the condition")


def stack_periods(layer_params: Sequence[Any], period: int) -> tuple[Any, ...]:
  """Per period position j < P: the params of layers j, j + P, ..., j + (N − 1)·P stacked leaf by leaf along a new
  leading axis of size N = ⌊len(layer_params) / P⌋ (a leaf [d...] becomes [N, d...])."""
  num_periods = len(layer_params) // period
  if num_periods < 1:
    raise ValueError(f"period: {period} exceeds the {len(layer_params)} layers")
  return tuple(jax.tree.map(lambda *leaves: jnp.stack(leaves), *layer_params[j::period][:num_periods])
               for j in range(period))


# The residual stream's rule: rows as the `batch` rule of `sao.models.sharding.LOGICAL_AXIS_RULES` (not imported:
# sharding imports the transformer, which imports this module), one dim over `tensor` (`sao.models.sequence_parallel`).
RESIDUAL_RULES = SPLIT_RULES


def shard_residual(x: Array, sequence_parallel: bool = False) -> Array:
  """x [B, T, E] constrained to B over the batch axes and E over `tensor` of the context mesh (module docstring) —
  T over `tensor` instead with `sequence_parallel` (`sao.models.sequence_parallel`); the identity where that mesh
  has no automatic `tensor` axis of size > 1 dividing the dim."""
  return split_tokens(x) if sequence_parallel else split_dim(x, x.ndim - 1)


def scan_periods(layer_fns: Sequence[LayerFn], stacked: tuple[Any, ...], x: Array,
                 sequence_parallel: bool = False) -> Array:
  """`x ← f_{P−1}(θ_{P−1}[n], ... f_0(θ_0[n], x))` for n = 0..N−1, as one `lax.scan` over n.

  layer_fns: f_j for each period position j; stacked: `stack_periods`' output; x: [B, T, E]. The carry must keep
  its dtype and shape through a period (a decoder layer maps [B, T, E] in the compute dtype to the same). Every
  layer's input goes through `shard_residual` (with `sequence_parallel`, its tokens split over `tensor`)."""
  residual = lambda h: shard_residual(h, sequence_parallel)
  if len(layer_fns) != len(stacked):
    raise ValueError(f"layer_fns: {len(layer_fns)} functions for a period of {len(stacked)} stacked layers")

  def period(carry: Array, params: tuple[Any, ...]) -> tuple[Array, None]:
    for fn, layer_params in zip(layer_fns, params):
      out = fn(layer_params, residual(carry))
      if out.shape != carry.shape or out.dtype != carry.dtype:
        raise ValueError(f"scan_layers: a decoder layer maps {carry.shape} {carry.dtype} to {out.shape} "
                         f"{out.dtype}; the scan carry needs them equal")
      carry = out
    return carry, None

  x, _ = jax.lax.scan(period, residual(x), stacked)
  return residual(x)
