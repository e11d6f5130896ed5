"""The project's one list of device-mesh axes, in mesh order, and the rule that maps a logical axis name onto them
(no JAX import: experiment configs read it), and how many copies of each KV head a `tensor` split needs
(`kv_repeats`).

`data` (pure data parallel), `fsdp` (data parallel with sharded parameters and optimizer state), `expert` (the
stacked experts of MoE layers), `tensor` (heads and hidden units). The trainer's mesh (`sao.train.mesh.make_mesh`)
builds all four; an axis of size 1 costs nothing. `sao.models.sharding` holds the rules table of logical axis names
and builds PartitionSpecs with `logical_mesh_axes`; `sao.models.scan` constrains the residual stream with it.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

MESH_AXES = ("data", "fsdp", "expert", "tensor")
BATCH_AXES = ("data", "fsdp", "expert")  # a data batch's rows, in this order (the `batch` sharding rule)
TENSOR_AXIS = "tensor"

# One PartitionSpec entry: a dim replicated (None), over one mesh axis, or over several (outermost first).
SpecEntry = str | tuple[str, ...] | None


def logical_mesh_axes(names: Sequence[str | None], shape: Sequence[int], mesh_shape: Mapping[str, int],
                      rules: Sequence[tuple[str, tuple[str, ...]]]) -> tuple[SpecEntry, ...]:
  """The PartitionSpec entries (one per dim) of an array with logical axis `names` and `shape` on a mesh of
  `mesh_shape` (axis name → size).

  Dim d with logical name n gets `rules[n]`'s mesh axes, less those `mesh_shape` lacks and those an earlier dim of
  the same array already uses; then axes are dropped from the end until their sizes' product divides `shape[d]`.
  So one rules table serves any mesh and tiny test shapes. A None name is replicated. ValueError for a name with no
  rule or `names` and `shape` of different lengths.
  """
  table = dict(rules)
  if len(names) != len(shape):
    raise ValueError(f"logical axes {tuple(names)} do not match shape {tuple(shape)}")
  used: set[str] = set()
  entries: list[SpecEntry] = []
  for name, size in zip(names, shape):
    if name is not None and name not in table:
      raise ValueError(f"logical axis {name!r}: no entry in the sharding rules")
    axes = [a for a in (table[name] if name else ()) if a in mesh_shape and a not in used]
    while axes and size % math.prod(int(mesh_shape[a]) for a in axes):
      axes.pop()
    used.update(axes)
    entries.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
  return tuple(entries)


def constrainable_axes(mesh) -> dict[str, int]:
  """The axes of a context mesh (`jax.sharding.get_abstract_mesh()`, duck-typed: this module imports no JAX) that a
  sharding constraint can use — the automatic ones of size > 1 — by size; {} for an empty mesh."""
  if mesh.empty:
    return {}
  return {a: n for a, n in mesh.shape.items() if a in mesh.auto_axes and n > 1}


def kv_repeats(heads: int, kv_heads: int, tensor: int) -> int:
  """How many copies of each KV head attention makes when `tensor` splits the H query heads over K KV heads
  (`sao.models.attention.replicate_kv_heads`, `sao.models.splash_attention.splash_layout`): 1 (none) when `tensor`
  divides the KV heads (each chip owns whole KV heads) or does not divide the query heads (the query heads are not
  split over `tensor` either); else r = lcm(K, tensor) / K, so that the K·r heads split evenly over `tensor`, each
  chip holding copies of only the KV heads its query heads read (r divides G = H / K since both K and tensor divide
  H)."""
  if tensor <= 1 or kv_heads % tensor == 0 or heads % tensor:
    return 1
  return math.lcm(kv_heads, tensor) // kv_heads
