"""JAX's persistent compilation cache, shared by every run that names the same directory.

A run compiles the same XLA programs as the run before it whenever the model, the batch shapes and the code did not
change (a sweep's seeds, a re-run, an ablation of a knob that is not compiled in): a learner update's programs and
each engine bucket's prefill and decode. With the executables on disk a later run loads them instead of compiling
(docs/performance_job.md, "Running and timing it"). JAX keys an entry by the program's HLO fingerprint, its
compile options and devices, and the jax/jaxlib/XLA versions, so a changed program is a new entry, never a stale hit.

The run config's `compilation_cache_dir` names the directory (`default_dir()`: `$SAO_CACHE_DIR/xla`, else
`$XDG_CACHE_HOME/sao/xla`, i.e. `~/.cache/sao/xla`; "" keeps it inside the run, `<workdir>/jax_cache`):

    <dir>/trainer              the trainer, every process of a multi-host job
    <dir>/engines              the local JAX engines (`python -m sao.engines.serve --compilation_cache_dir`)

JAX writes entries from process 0 only and every process reads them (`jax._src.compiler._cache_write`), so the
processes of a job share one directory: on a pod, a directory every host sees (a bucket) serves every host; a
host-local one serves process 0 (a directory per process would leave every other process's empty forever). On CPU
JAX's keys differ from process to process of one job (XLA:CPU's topology fingerprint is each process's own), so
only process 0 would ever hit: `share_cpu_keys_across_processes` (called when a CPU job starts) keys CPU programs by
the job's devices instead.

Each directory is bounded (`compilation_cache_max_gb`): JAX then evicts the least recently used entries and takes a
file lock around each read and write, so runs that share a directory at the same time do not read half-written
entries.
"""
from __future__ import annotations

import logging
import os

_GB = 1 << 30


def default_dir() -> str:
  """`$SAO_CACHE_DIR/xla`; without SAO_CACHE_DIR, `$XDG_CACHE_HOME/sao/xla`, or `~/.cache/sao/xla` where
  XDG_CACHE_HOME is unset too (the XDG convention)."""
  if os.environ.get("SAO_CACHE_DIR"):
    return os.path.join(os.environ["SAO_CACHE_DIR"], "xla")
  return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                      "sao", "xla")


def run_dir(configured: str, workdir: str) -> str:
  """The cache directory of a run: `configured` (`~` and `$VARS` expanded) made absolute, or `<workdir>/jax_cache`
  when `configured` is ""."""
  path = os.path.expandvars(os.path.expanduser(configured)) if configured else os.path.join(workdir, "jax_cache")
  return os.path.abspath(path)


def trainer_dir(cache_dir: str) -> str:
  """The trainer's directory, shared by the processes of a job (see the module docstring)."""
  return os.path.join(cache_dir, "trainer")


def engines_dir(cache_dir: str) -> str:
  return os.path.join(cache_dir, "engines")


def max_bytes(max_gb: float) -> int:
  """JAX's `jax_compilation_cache_max_size` for a bound of `max_gb` GiB (> 0). Raises ValueError otherwise: JAX
  reads 0 as "cache nothing" and -1 as "unbounded, and no file lock"."""
  if not max_gb > 0:
    raise ValueError(f"compilation_cache_max_gb: must be > 0, got {max_gb}")
  return int(max_gb * _GB)


def enable(path: str, max_gb: float, min_compile_time_s: float, gpu_kernel_cache: bool = False) -> None:
  """Caches this process's XLA executables that took at least `min_compile_time_s` to compile in `path`, at most
  `max_gb` GiB of them (least recently used evicted). Programs compiled before the call are not cached.

  On GPU, XLA's own caches go beside the executables: per-fusion autotuning results always (JAX's default; process 0
  writes, the others read), and with `gpu_kernel_cache` the compiled kernels too (`xla_gpu_kernel_cache_file`, one
  file every writer appends to: for a process that has its directory to itself). Both serve a program never compiled
  before (another bucket length, a changed model) with the fusions and kernels it shares with earlier ones.
  No effect on CPU or TPU."""
  import jax  # pylint: disable=g-import-not-at-top  (the config files import `default_dir` without jax)
  size = max_bytes(max_gb)
  os.makedirs(path, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_compilation_cache_max_size", size)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
  jax.config.update("jax_persistent_cache_enable_xla_caches",
                    "all" if gpu_kernel_cache else "xla_gpu_per_fusion_autotune_cache_dir")


def share_cpu_keys_across_processes() -> bool:
  """Gives a CPU job's processes one cache key per program, so every process reads the executables process 0 wrote
  (a restarted job, the next job on the same directory). Returns whether the keys are now shared.

  JAX hashes the program's devices by their topology fingerprint (`jax._src.cache_key._hash_accelerator_config`),
  and XLA:CPU's fingerprint differs between the processes of one job (their keys differed in exactly that part:
  `tests/train/test_cpu_cache_keys.py`). For programs whose devices are all CPU devices this hashes, instead, what
  every process of the job sees alike: each device's platform, kind, global id and process index, in the program's
  device order — a different device set or order is a different key. Other platforms keep JAX's hash (a TPU or GPU
  fingerprint is already the job's). Private JAX API: where it is missing this logs a warning, returns False and
  changes nothing (the job then compiles on every process but process 0, as before). Idempotent."""
  from jax._src import cache_key  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  original = getattr(cache_key, "_hash_accelerator_config", None)
  if original is None:
    logging.warning("compilation cache: jax._src.cache_key._hash_accelerator_config is gone; CPU processes other "
                    "than 0 will not hit the persistent cache")
    return False
  if getattr(original, "sao_job_keys", False):
    return True

  def hash_devices(hash_obj, accelerators) -> None:
    devices = list(accelerators.flat)
    if not devices or any(d.platform != "cpu" for d in devices):
      original(hash_obj, accelerators)
      return
    for d in devices:
      hash_obj.update(f"{d.platform}:{d.device_kind}:{d.id}:{d.process_index};".encode())

  hash_devices.sao_job_keys = True
  hash_devices.jax_hash = original  # JAX's own, for the test that shows the keys differed
  cache_key._hash_accelerator_config = hash_devices  # pylint: disable=protected-access
  return True
