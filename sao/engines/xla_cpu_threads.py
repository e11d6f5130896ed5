"""How many threads XLA:CPU computes with in this process: fewer than the host's cores when processes share them.

XLA:CPU sizes its thread pools (Eigen's intra-op pool, the PJRT client's) from the CPUs this process may run on —
its affinity mask — when JAX creates the CPU backend. Every process of the README's toy job (trainer, engine) gets
pools as wide as the machine, and on 2 cores shared by three busy processes the extra threads mostly hand work back
and forth: with one-thread pools the three processes spent ≈ 15 % less CPU per RL step and the step got ≈ 11 %
shorter (docs/performance_job.md, "XLA:CPU threads per process").

`limit(n)` narrows this process's affinity to n of its CPUs, creates JAX's backends, then gives every thread of the
process its former affinity back: the pools keep n threads, and every thread (theirs included) may still run on any
CPU, as the scheduler sees fit. It must run before JAX has created a backend (a pool sized already cannot shrink),
i.e. before the first computation, `jax.devices()` or array; called later, it logs a warning that it has no effect
and returns False. `n <= 0` or `n >=` the CPUs available changes nothing, and so does a process whose JAX runs on a GPU or TPU
(`host_platform.runs_on_cpu`): its device compiler's thread pools are sized from the same mask. Linux only (elsewhere it does nothing and
returns False). A process with several (fake) CPU devices still gets a thread per device: XLA sizes its pool to at
least the device count, so devices meeting at a collective never wait for one another's thread.
The run config's `xla_cpu_threads` sets it for the trainer process (`launch/run.py`) and for the local engines it
starts (`python -m sao.engines.serve --xla_cpu_threads`).
"""
from __future__ import annotations

import logging
import os

from sao.engines import host_platform

log = logging.getLogger(__name__)


def limit(n: int) -> bool:
  """Creates JAX's backends with XLA:CPU pools of `n` threads (module docstring); returns whether it narrowed them."""
  if n <= 0 or not hasattr(os, "sched_getaffinity") or not os.path.isdir("/proc/self/task"):
    return False
  if not host_platform.runs_on_cpu():
    # On a GPU / TPU host the backends made under a narrowed mask would size every pool from it, the GPU compiler's
    # (autotuning, per-kernel LLVM) included: n threads to compile for the device. The CPU pools matter little there.
    log.info("xla_cpu_threads=%d not applied: JAX runs on an accelerator in this process", n)
    return False
  cpus = sorted(os.sched_getaffinity(0))
  if n >= len(cpus):
    return False
  import jax  # pylint: disable=g-import-not-at-top
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  if xla_bridge.backends_are_initialized():  # e.g. a trainer run inside a test process: its pools stay as they are
    log.warning("xla_cpu_threads=%d has no effect: this process's JAX backends exist already (their thread pools "
                "are sized); it applies when set before the first JAX computation", n)
    return False
  os.sched_setaffinity(0, cpus[:n])
  try:
    jax.devices()  # creates the backends: their pools are sized from the narrowed mask
  finally:
    for tid in os.listdir("/proc/self/task"):
      try:
        os.sched_setaffinity(int(tid), cpus)
      except ProcessLookupError:  # a thread that ended meanwhile
        pass
  return True
