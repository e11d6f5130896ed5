"""`MeshJit`: a jitted program of the learner — traced under the learner's mesh (`jax.set_mesh`), recorded by name
and shapes in the running update's `ProgramLog`, and, in a multi-process job on XLA:CPU, run to completion before
the next program is dispatched.

The learner's steps and forward passes (`sao.train.steps`), the update's target programs (`sao.train.targets`,
`sao.train.grouped_targets`: `program(...)`, no mesh) and the ahead-of-time compile report run these objects.

Why serial execution on XLA:CPU. JAX dispatches asynchronously: the host queues an update's programs (per length
group: the critic's forwards, its epochs' steps, the targets' programs...) while earlier ones still run. On a TPU or
GPU each device runs its queue in order, so every process executes the programs in the order all of them
dispatched them. XLA:CPU instead runs each program's per-device parts on one thread pool of (at least) one thread
per local device, reserved per part: with two programs in flight their parts can split the reservations between them
(program A holds 3 of 4 devices' threads, program B the 4th), and a cross-process collective, which needs every
device's part at once, then waits forever for a part that waits for a thread — in a different interleaving on each
process. That is the two-process deadlock of the README toy in value pretraining (process 1's fourth device part
blocked on the reservation semaphore while its other three sat in a gloo all-gather). `serialize_executions(True)`,
set by `sao.train.distributed.initialize` for a multi-process CPU job, makes every `MeshJit` call wait for its
outputs: one program in flight per process, in the same order on every process, by construction.
"""
from __future__ import annotations

import hashlib
import threading
from typing import Any, Callable

import jax
from jax.sharding import Mesh

_serial: bool | None = False  # None: decided at the first call, from the backend JAX then has


def serialize_executions(on: bool | str) -> None:
  """With `on`, every `MeshJit` call returns only once its outputs are ready (module docstring); with `"cpu"`, only
  if the default backend is XLA:CPU, decided at the first call (so that asking does not create JAX's backends
  early, before `sao.engines.xla_cpu_threads` sizes them)."""
  global _serial  # pylint: disable=global-statement
  if on not in (True, False, "cpu"):
    raise ValueError(f"serialize_executions: expected True, False or 'cpu', got {on!r}")
  _serial = None if on == "cpu" else bool(on)


def executions_serialized() -> bool:
  global _serial  # pylint: disable=global-statement
  if _serial is None:
    _serial = jax.default_backend() == "cpu"
  return _serial


class ProgramLog:
  """The programs one update dispatched, in order: `(name, shapes)` per call, `shapes` the `(shape, dtype)` of every
  array argument. `with ProgramLog() as log:` records the calls of this thread until the block ends."""
  _active = threading.local()

  def __init__(self):
    self.calls: list[tuple[str, str]] = []

  def __enter__(self) -> "ProgramLog":
    self._outer = getattr(ProgramLog._active, "log", None)
    ProgramLog._active.log = self
    return self

  def __exit__(self, *exc) -> None:
    ProgramLog._active.log = self._outer

  @classmethod
  def record(cls, name: str, args: tuple, kwargs: dict) -> None:
    log = getattr(cls._active, "log", None)
    if log is not None:
      shapes = ",".join(f"{tuple(x.shape)}:{x.dtype}" for x in jax.tree.leaves((args, kwargs)) if hasattr(x, "shape"))
      log.calls.append((name, shapes))

  def digest(self) -> str:
    """A short hash of the sequence: equal sequences, equal digests."""
    return hashlib.sha256(repr(self.calls).encode()).hexdigest()[:16]

  def summary(self) -> dict[str, Any]:
    """`{"programs": count, "digest": ..., "names": {name: count}}`: what two processes compare."""
    names: dict[str, int] = {}
    for name, _ in self.calls:
      names[name] = names.get(name, 0) + 1
    return {"programs": len(self.calls), "digest": self.digest(), "names": names}


class MeshJit:
  """`jax.jit(fn, **jit_kwargs)` whose every trace — a call, `trace`, `lower`, `eval_shape` — runs under
  `jax.set_mesh(mesh)` (when `mesh` is given), so the model sees the learner's mesh (`jax.sharding.
  get_abstract_mesh()`) and lays out its activations by mesh axis names (the routed MoE's shard_map,
  `sao.models.moe`). The learner and the ahead-of-time compile report (`sao.aot.driver`) run the same objects. The
  mesh's axes stay `Auto`: GSPMD still shards everything the model does not lay out itself.

  A call is recorded in the thread's `ProgramLog` and, with `serialize_executions`, waits for its outputs."""

  def __init__(self, fn: Callable, mesh: Mesh | None, *, name: str | None = None, **jit_kwargs):
    self.mesh = mesh
    self.name = name or getattr(fn, "__name__", "program")
    self.jitted = jax.jit(fn, **jit_kwargs)
    self.__wrapped__ = fn
    self.__doc__ = getattr(fn, "__doc__", None)

  def _traced(self, method: Callable, *args, **kwargs):
    if self.mesh is None:
      return method(*args, **kwargs)
    with jax.set_mesh(self.mesh):
      return method(*args, **kwargs)

  def __call__(self, *args, **kwargs):
    ProgramLog.record(self.name, args, kwargs)
    serial = _serial or (_serial is None and executions_serialized())
    if serial:  # an input still being computed by a program dispatched elsewhere (not a MeshJit): finish it first
      jax.block_until_ready([x for x in jax.tree.leaves((args, kwargs)) if isinstance(x, jax.Array)])
    out = self._traced(self.jitted, *args, **kwargs)
    if serial:
      jax.block_until_ready(out)
    return out

  def trace(self, *args, **kwargs):
    return self._traced(self.jitted.trace, *args, **kwargs)

  def lower(self, *args, **kwargs):
    return self._traced(self.jitted.lower, *args, **kwargs)

  def eval_shape(self, *args, **kwargs):
    return self._traced(self.jitted.eval_shape, *args, **kwargs)


def program(fn: Callable | None = None, **jit_kwargs) -> Any:
  """`jax.jit` as a mesh-free `MeshJit` (a decorator, with or without `jit_kwargs`): a program of the update that
  is recorded and, in a multi-process CPU job, run to completion before the next (module docstring)."""
  if fn is None:
    return lambda f: MeshJit(f, None, **jit_kwargs)
  return MeshJit(fn, None, **jit_kwargs)
