"""Role state (`TrainState`) built shape-first: abstract tree → shardings → one jitted init into those shardings.

Nothing is materialised unsharded on one device except what the caller hands in: `init_state` copies the caller's
params through a jit whose `out_shardings` are the mesh shardings (so the learner owns its buffers and can donate
them), and the optimizer state is created inside the same jit, already sharded like the params it mirrors.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from sao.train import mesh as mesh_lib
from sao.train import mesh_jit
from sao.train.optim import param_path
from sao.train.steps import TrainState


def state_shardings(abstract_params: Any, param_shardings: Any, tx: optax.GradientTransformation,
                    mesh: Mesh) -> TrainState:
  """`TrainState` of NamedShardings: params as given, optimizer state mirrored, counters replicated."""
  abstract_opt = jax.eval_shape(tx.init, abstract_params)
  rep = mesh_lib.replicated(mesh)
  return TrainState(step=rep, params=param_shardings,
                    opt_state=mesh_lib.mirrored_shardings(abstract_opt, abstract_params, param_shardings, mesh),
                    skipped=rep)


def abstract_state(abstract_params: Any, shardings: TrainState, tx: optax.GradientTransformation) -> TrainState:
  """`TrainState` of `jax.ShapeDtypeStruct`s carrying their shardings (the target of an orbax restore)."""
  shapes = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract_params,
                      opt_state=jax.eval_shape(tx.init, abstract_params),
                      skipped=jax.ShapeDtypeStruct((), jnp.int32))
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


def check_params(name: str, params: Any, abstract_params: Any) -> None:
  """Raises ValueError naming the first param path whose presence, shape or dtype differs from the model's."""
  given = {param_path(p): x for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
  expected = {param_path(p): x for p, x in jax.tree_util.tree_flatten_with_path(abstract_params)[0]}
  for path in sorted(set(given) | set(expected)):
    if path not in given:
      raise ValueError(f"{name}: missing parameter {path!r}")
    if path not in expected:
      raise ValueError(f"{name}: unexpected parameter {path!r}")
    g, e = given[path], expected[path]
    if tuple(np.shape(g)) != tuple(e.shape) or jnp.dtype(g.dtype) != jnp.dtype(e.dtype):
      raise ValueError(f"{name}: parameter {path!r} has {np.shape(g)} {g.dtype}, model expects {e.shape} {e.dtype}")


def init_state(params: Any, shardings: TrainState, tx: optax.GradientTransformation) -> TrainState:
  """A fresh `TrainState` (step 0, zero moments) holding a sharded *copy* of `params`."""
  # jnp.copy: an untouched input would be forwarded as the output buffer, and the step's donation would then
  # delete the caller's arrays.
  init = mesh_jit.program(lambda p: TrainState(step=jnp.zeros((), jnp.int32), params=jax.tree.map(jnp.copy, p),
                                                opt_state=tx.init(p), skipped=jnp.zeros((), jnp.int32)),
                          out_shardings=shardings)
  return init(params)
