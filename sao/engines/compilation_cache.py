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
the executables of different processes have different keys: there only process 0 ever hits.

Each directory is bounded (`compilation_cache_max_gb`): JAX then evicts the least recently used entries and takes a
file lock around each read and write, so runs that share a directory at the same time do not read half-written
entries.
"""
from __future__ import annotations

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
