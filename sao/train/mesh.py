"""Device mesh, parameter/optimizer-state shardings and batch shardings for the learner.

Mesh axes: `data` (pure data parallel), `fsdp` (data parallel + parameter sharding), `tensor` (model parallel).
Batches are sharded over `("data", "fsdp")` on their first axis. Parameters carry logical axis names
(`sao.models.layers`); `LOGICAL_RULES` maps them to mesh axes. A dimension whose size the mesh axis does not divide
is replicated instead (tiny test models on 8 devices), so any model fits any mesh.

Optimizer states are sharded like the parameters they mirror: an optax state leaf whose key path ends with a
parameter's path (e.g. `…/mu/model/layers_0/mlp/up_proj/kernel`) and has its shape gets that parameter's sharding;
everything else (step counts, scalars) is replicated.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
# Logical parameter axis → mesh axis (None = replicated). FSDP shards the hidden (`embed`) dimension of every
# matrix; tensor parallelism shards heads, MLP width and vocabulary.
LOGICAL_RULES: tuple[tuple[str, str | None], ...] = (
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("expert", None),
    ("expert_mlp", "tensor"),
    ("norm", None),
)


def make_mesh(shape: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A `("data", "fsdp", "tensor")` mesh; one size may be −1 (= the remaining devices). Raises ValueError."""
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


def batch_parallel_size(mesh: Mesh) -> int:
  """Number of shards along the batch axis (`data × fsdp`)."""
  return int(np.prod([mesh.shape[a] for a in BATCH_AXES]))


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
  """`[B, ...]` arrays: B over ("data", "fsdp"), the rest replicated."""
  return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def _fit_spec(spec: P, shape: tuple[int, ...], mesh: Mesh) -> P:
  """Replaces any mesh axis that does not divide its dimension by None."""
  out = []
  for dim, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    names = (axis,) if isinstance(axis, str) else tuple(axis or ())
    size = int(np.prod([mesh.shape[n] for n in names])) if names else 1
    out.append(axis if names and dim % size == 0 else None)
  return P(*out)


def param_shardings(boxed_abstract_params: Any, mesh: Mesh) -> Any:
  """NamedShardings for an abstract parameter tree whose leaves are `nn.LogicallyPartitioned` (or plain leaves,
  which are replicated). Returns a tree of the *unboxed* structure."""
  specs = nn.get_partition_spec(boxed_abstract_params)
  shapes = nn.meta.unbox(boxed_abstract_params)
  is_leaf = lambda x: isinstance(x, P)

  def to_sharding(spec, shape):
    mesh_spec = nn.logical_to_mesh_axes(tuple(spec), LOGICAL_RULES) if len(spec) else P()
    return NamedSharding(mesh, _fit_spec(mesh_spec, tuple(shape.shape), mesh))

  return jax.tree.map(to_sharding, specs, shapes, is_leaf=is_leaf)


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
