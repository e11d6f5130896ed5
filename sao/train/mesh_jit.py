"""`MeshJit`: a jitted program that always traces under the learner's mesh (`jax.set_mesh`).

The learner's steps and forward passes (`sao.train.steps`) and the ahead-of-time compile report (`sao.aot.driver`)
are `MeshJit`s, so the model lays out its activations by mesh axis names wherever it is traced.
"""
from __future__ import annotations

from typing import Callable

import jax
from jax.sharding import Mesh


class MeshJit:
  """`jax.jit(fn, **jit_kwargs)` whose every trace — a call, `trace`, `lower`, `eval_shape` — runs under
  `jax.set_mesh(mesh)`, so the model sees the learner's mesh (`jax.sharding.get_abstract_mesh()`) and lays out its
  activations by mesh axis names (the routed MoE's shard_map, `sao.models.moe`). The learner and the ahead-of-time
  compile report (`sao.aot.driver`) run the same objects. The mesh's axes stay `Auto`: GSPMD still shards everything
  the model does not lay out itself, as it did without the context mesh."""

  def __init__(self, fn: Callable, mesh: Mesh, **jit_kwargs):
    self.mesh = mesh
    self.jitted = jax.jit(fn, **jit_kwargs)

  def __call__(self, *args):
    with jax.set_mesh(self.mesh):
      return self.jitted(*args)

  def trace(self, *args):
    with jax.set_mesh(self.mesh):
      return self.jitted.trace(*args)

  def lower(self, *args):
    with jax.set_mesh(self.mesh):
      return self.jitted.lower(*args)

  def eval_shape(self, *args):
    with jax.set_mesh(self.mesh):
      return self.jitted.eval_shape(*args)
