"""Logical axis names → mesh axes: one rules table, and the PartitionSpec / NamedSharding trees of model params.

Every parameter is created with logical axis names (see `sao.models.layers`). `LOGICAL_AXIS_RULES` maps each name to
mesh axes; a mesh axis the mesh lacks is dropped, a mesh axis already used by an earlier dim of the same param is
dropped, and mesh axes are dropped from the end until the dim size divides evenly — so one table serves any mesh
(a 1-device CPU run, data × fsdp × tensor, or an expert-parallel mesh) and tiny test shapes. The rule itself is
`sao.models.mesh_axes.logical_mesh_axes` (JAX-free; `sao.models.scan` uses it too, below this module).
"""
from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sao.models.config import ModelConfig
from sao.models.mesh_axes import BATCH_AXES, MESH_AXES, logical_mesh_axes  # noqa: F401  (MESH_AXES re-exported)
from sao.models.transformer import abstract_params

LOGICAL_AXIS_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    # logical name   mesh axes (in order)
    ("batch",        BATCH_AXES),  # activations / data batches
    ("vocab",        ("tensor",)),
    ("embed",        ("fsdp",)),
    ("heads",        ("tensor",)),
    ("kv_heads",     ("tensor",)),
    ("head_dim",     ()),
    ("mlp",          ("tensor",)),
    ("expert",       ("expert",)),
    ("expert_mlp",   ("tensor",)),
    ("linear_heads", ("tensor",)),  # Gated DeltaNet heads (per-head vectors, grouped qwen3_next projections)
    ("linear_mix",   ("tensor",)),  # Gated DeltaNet projection widths ([q | k | v] conv channels, z, out_proj input)
    ("norm",         ()),
)


def logical_to_spec(names: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                    rules: Sequence[tuple[str, tuple[str, ...]]] = LOGICAL_AXIS_RULES) -> PartitionSpec:
  """PartitionSpec for one array with logical axis `names` and `shape` on `mesh` (the rule:
  `sao.models.mesh_axes.logical_mesh_axes`)."""
  return PartitionSpec(*logical_mesh_axes(names, shape, mesh.shape, rules))


def _is_boxed(x: Any) -> bool:
  return isinstance(x, nn.LogicallyPartitioned)


def param_partition_specs(params_or_config: ModelConfig | dict, mesh: Mesh, critic: bool = False,
                          rules: Sequence[tuple[str, tuple[str, ...]]] = LOGICAL_AXIS_RULES) -> dict:
  """PartitionSpec tree matching the (unboxed) param tree.

  params_or_config: a ModelConfig (policy tree, or critic tree with `critic=True`) or an abstract tree whose leaves
  are `nn.LogicallyPartitioned` (e.g. `abstract_params(config)` or `jax.eval_shape(model.init, ...)['params']`).
  """
  tree = abstract_params(params_or_config, critic) if isinstance(params_or_config, ModelConfig) else params_or_config
  leaves = jax.tree.leaves(tree, is_leaf=_is_boxed)
  if not all(_is_boxed(leaf) for leaf in leaves):
    raise ValueError("params_or_config: leaves carry no logical axis names; pass the ModelConfig or a tree from "
                     "sao.models.transformer.abstract_params")
  return jax.tree.map(lambda leaf: logical_to_spec(leaf.names, leaf.value.shape, mesh, rules), tree,
                      is_leaf=_is_boxed)


def param_shardings(params_or_config: ModelConfig | dict, mesh: Mesh, critic: bool = False,
                    rules: Sequence[tuple[str, tuple[str, ...]]] = LOGICAL_AXIS_RULES) -> dict:
  """NamedSharding tree matching the param tree (for `jax.device_put` / jit `in_shardings`)."""
  specs = param_partition_specs(params_or_config, mesh, critic, rules)
  return jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs,
                      is_leaf=lambda x: isinstance(x, PartitionSpec))


def batch_sharding(mesh: Mesh, ndim: int = 2, batch_size: int | None = None) -> NamedSharding:
  """Sharding of a `[B, ...]` data array: B over the `batch` rule's mesh axes (those dividing `batch_size`, when
  given), other dims replicated."""
  size = batch_size if batch_size is not None else int(np.prod(list(mesh.shape.values())))
  return NamedSharding(mesh, logical_to_spec(("batch",) + (None,) * (ndim - 1), (size,) + (1,) * (ndim - 1), mesh))
