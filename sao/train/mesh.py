"""Device mesh, parameter/optimizer-state shardings and batch shardings for the learner.

Mesh axes (`sao.models.mesh_axes.MESH_AXES`, the one definition): `data` (pure data parallel), `fsdp` (data
parallel + parameter sharding), `expert` (MoE experts; size 1 unless configured), `tensor` (model parallel).
Batches are sharded on their first axis by the `"batch"` logical rule (`data`, `fsdp`, `expert`). Parameters carry
logical axis names (`sao.models.layers`); `sao.models.sharding.LOGICAL_AXIS_RULES` maps them to mesh axes. A dimension
whose size the mesh axis does not divide is replicated instead (tiny test models on 8 devices), so any model fits
any mesh.

Optimizer states are sharded like the parameters they mirror: an optax state leaf whose key path ends with a
parameter's path (e.g. `…/mu/model/layers_0/mlp/up_proj/kernel`) and has its shape gets that parameter's sharding;
everything else (step counts, scalars) is replicated.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sao.models import sharding as model_sharding
from sao.models.mesh_axes import MESH_AXES


def make_mesh(shape: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A mesh over `MESH_AXES`; an axis `shape` omits has size 1, one size may be −1 (= the remaining devices).
  Raises ValueError."""
  devices = list(devices if devices is not None else jax.devices())
  unknown = set(shape) - set(MESH_AXES)
  if unknown:
    raise ValueError(f"mesh: unknown axes {sorted(unknown)}; expected {MESH_AXES}")
  sizes = [int(shape.get(a, 1)) for a in MESH_AXES]
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"mesh: sizes must be positive with at most one -1, got {dict(zip(MESH_AXES, sizes))}")
  known = int(np.prod([s for s in sizes if s != -1]))
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f"mesh: {len(devices)} devices are not divisible by {known}")
    sizes[sizes.index(-1)] = len(devices) // known
  if int(np.prod(sizes)) > len(devices):
    raise ValueError(f"mesh: shape {dict(zip(MESH_AXES, sizes))} needs {np.prod(sizes)} devices, "
                     f"have {len(devices)}")
  grid = np.asarray(devices[:int(np.prod(sizes))]).reshape(sizes)
  return Mesh(grid, MESH_AXES)


def batch_sharding(mesh: Mesh, ndim: int = 1) -> NamedSharding:
  """`[B, ...]` arrays: B by the `"batch"` logical rule, the rest replicated. With `ndim = 1` it is a prefix that
  serves a whole dict of batch arrays. `B` must be a multiple of `batch_parallel_size(mesh)`."""
  return model_sharding.batch_sharding(mesh, ndim)


def batch_parallel_size(mesh: Mesh) -> int:
  """Number of shards along the batch axis (the product of the mesh axes the `"batch"` rule uses)."""
  axes = batch_sharding(mesh).spec[0]
  axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
  return int(np.prod([mesh.shape[a] for a in axes]))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def param_shardings(boxed_abstract_params: Any, mesh: Mesh) -> Any:
  """NamedShardings for an abstract parameter tree whose leaves are `nn.LogicallyPartitioned`, by the model layer's
  one rules table (`sao.models.sharding.LOGICAL_AXIS_RULES`). Returns a tree of the *unboxed* structure."""
  return model_sharding.param_shardings(boxed_abstract_params, mesh)


def _path_keys(path) -> tuple[str, ...]:
  keys = []
  for k in path:
    if isinstance(k, jax.tree_util.DictKey):
      keys.append(str(k.key))
    elif isinstance(k, jax.tree_util.GetAttrKey):
      keys.append(k.name)
    elif isinstance(k, jax.tree_util.SequenceKey):
      keys.append(str(k.idx))
    else:
      keys.append(str(k))
  return tuple(keys)


def mirrored_shardings(tree: Any, params: Any, shardings: Any, mesh: Mesh) -> Any:
  """Shardings for an abstract `tree` (e.g. an optax state): a leaf whose key path ends with a parameter's path and
  whose shape matches gets that parameter's sharding; other leaves are replicated."""
  by_path = {}
  for (path, leaf), sharding in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(shardings)):
    by_path[_path_keys(path)] = (tuple(leaf.shape), sharding)

  def pick(path, leaf):
    keys = _path_keys(path)
    for start in range(len(keys)):
      hit = by_path.get(keys[start:])
      if hit is not None and hit[0] == tuple(getattr(leaf, "shape", ())):
        return hit[1]
    return replicated(mesh)

  return jax.tree_util.tree_map_with_path(pick, tree)
