"""The multi-process (multi-controller) JAX runtime: one trainer process per host, every process running the same
program and issuing the same jitted calls in the same order, each owning only its addressable shards.

    initialize(...)            once per process, before any other JAX call touches a device
    is_coordinator()           process 0: the one that owns I/O that must happen once (gRPC, logs, metrics, exports)
    barrier(name)              every process waits until all reached the same barrier (bounded: raises on timeout)
    global_batch(batch, sh)    host batch (the same numpy values on every process) → global arrays in sharding `sh`
    global_array(x, sh)        the same for one array
    fetch(tree)                any array (also one spanning processes) → numpy on every process (collective)

With one process (no `initialize` call) every function is the single-process identity: `barrier` returns at once,
`global_batch` is `jax.device_put` and `fetch` is `jax.device_get`.
"""
from __future__ import annotations

import itertools
from typing import Any, Mapping

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils
from jax.sharding import Sharding

from sao.engines import compilation_cache
from sao.train import mesh_jit

_barrier_counter = itertools.count()


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, initialization_timeout_s: int = 300,
               heartbeat_timeout_s: int = 100) -> None:
  """Joins this process to the job. All three of `coordinator_address` ("host:port" of process 0), `num_processes`
  and `process_id` for an explicit (CPU) job; none of them on a TPU pod, where JAX detects the cluster itself.

  On the CPU platform the cross-process collectives are gloo's (`jax_cpu_collectives_implementation`, which must be
  set before the backend starts). `heartbeat_timeout_s`: after this long without heartbeats from a process, the
  coordination service declares it dead and the others' pending collectives and barriers fail. Raises ValueError on
  a partial set of arguments or a `process_id` outside `[0, num_processes)`."""
  explicit = (coordinator_address, num_processes, process_id)
  if any(a is not None for a in explicit) and any(a is None for a in explicit):
    raise ValueError("distributed: give coordinator_address, num_processes and process_id together (a CPU job), or "
                     f"none of them (auto-detection on TPU); got {explicit}")
  if num_processes is not None and not 0 <= process_id < num_processes:
    raise ValueError(f"distributed: process_id {process_id} is outside [0, num_processes={num_processes})")
  platforms = str(jax.config.jax_platforms or "")
  cpu_job = coordinator_address is not None and (platforms == "" or "cpu" in platforms.split(","))
  if cpu_job:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                             process_id=process_id, initialization_timeout=initialization_timeout_s,
                             heartbeat_timeout_seconds=heartbeat_timeout_s)
  # XLA:CPU runs in-flight multi-device programs' parts on one reserved thread pool: two programs with cross-process
  # collectives in flight at once can deadlock the job (sao.train.mesh_jit). One program at a time per process.
  if cpu_job and num_processes > 1:
    mesh_jit.serialize_executions("cpu")  # decided at the first program, once the backend exists
    # Process 0's cached executables serve every process (JAX's own CPU keys differ per process).
    compilation_cache.share_cpu_keys_across_processes()
  # From the arguments only: asking JAX for its devices here would create its backends, and XLA:CPU's thread pools
  # would be sized before `sao.engines.xla_cpu_threads.limit` (which the trainer calls next) could size them.
  logging.info("distributed: joined as process %s of %s (coordinator %s)", process_id, num_processes,
               coordinator_address or "detected by JAX")


def is_coordinator() -> bool:
  """True on process 0 (and in a single-process run)."""
  return jax.process_index() == 0


def barrier(name: str, timeout_s: float = 600.0) -> None:
  """Blocks until every process called `barrier` with the same `name` (calls pair up in program order: each gets a
  fresh id, `name#n`). Raises (from the coordination service) after `timeout_s`, or when a process is lost."""
  if jax.process_count() == 1:
    return
  barrier_id = f"{name}#{next(_barrier_counter)}"
  from jax._src import distributed as jax_distributed  # the coordination client: a barrier with a timeout
  client = jax_distributed.global_state.client
  if client is None:
    raise RuntimeError(f"barrier {barrier_id!r}: {jax.process_count()} processes but no distributed client")
  client.wait_at_barrier(barrier_id, int(timeout_s * 1000))


def global_batch(batch: Mapping[str, Any], sharding: Sharding) -> dict[str, jax.Array]:
  """Global arrays in `sharding` (a prefix sharding: dim 0, the batch, of every array) from a host batch that holds
  the SAME full values on every process.

  `jax.make_array_from_callback`: each process copies to its addressable devices only the slices that live there,
  cut from its own full copy — right for any mesh (the batch axis spanning processes or not), with no cross-process
  traffic, and the global shape is the host batch's shape by construction. (`make_array_from_process_local_data`
  would want each process's own rows, which depend on how the mesh lays devices over processes.) When every device
  of the sharding is addressable (one process), this is `jax.device_put`, as before multi-host support."""
  if sharding.is_fully_addressable:
    return jax.device_put(dict(batch), sharding)
  return {key: global_array(value, sharding) for key, value in batch.items()}


def global_array(value: Any, sharding: Sharding) -> jax.Array:
  """One global array in `sharding` from a host value that is the same on every process (see `global_batch`)."""
  if sharding.is_fully_addressable:
    return jax.device_put(value, sharding)
  array = np.asarray(value)
  return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def fetch(tree: Any) -> Any:
  """Numpy copies of every array leaf in `tree`, on every process. Arrays this process can read whole (fully
  addressable or fully replicated) are copied locally; arrays spanning processes are gathered with
  `process_allgather`, a collective: every process must call `fetch` on the same tree. Holds the whole tree on the
  host: use it for metrics and per-token traces, not params (`sao.train.export` gathers those one tensor at a time)."""
  def one(x):
    if isinstance(x, jax.Array) and not (x.is_fully_addressable or x.is_fully_replicated):
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))
  return jax.tree.map(one, tree)
