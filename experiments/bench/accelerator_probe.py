"""What the accelerator check (`bench_accelerator.py`) measures inside one row's process: JSON-lines records, the
XLA compiles of a span (each program's seconds and whether JAX's persistent compilation cache served it), the bf16
matmul peak, peak device memory and the learner's FLOP count.

FLOP convention (`bench_train.py`'s): one SAO update counts `6·P·tokens` per training step (forward + backward) and
`2·P·tokens` per forward, for the actor and the critic: `6·P_actor·N + K·6·P_critic·N + F·2·P_critic·N` with N =
B·T tokens, K critic epochs and F critic forwards (2 when the critic reads V⁰ before its epochs, else 1). P counts
every parameter (embeddings included); for a routed MoE only the experts a token runs count (`active_params`:
the expert weights scaled by top-k / E). Attention's T² term is left out, as in the usual MFU convention.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

# the repository, two folders up: this checkout's `sao` (as in every experiments/ script)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# jax._src.dispatch.BACKEND_COMPILE_EVENT: one per XLA compile (a persistent-cache hit included, which then takes the
# time of the read); jax._src.compiler records CACHE_HIT_EVENT inside that span when the cache served the executable.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


class Recorder:
  """Appends one JSON object per line to `path` (flushed at once: a row killed later keeps what it wrote) and
  prints it as one human line. Every record carries the row's name and `t`, seconds since `start` (a
`time.perf_counter()` reading; default: now)."""

  def __init__(self, path: str, row: str, start: float | None = None):
    self.path, self.row = path, row
    self.start = time.perf_counter() if start is None else start

  def __call__(self, phase: str, **fields: Any) -> dict:
    record = {"row": self.row, "phase": phase, "t": round(time.perf_counter() - self.start, 3), **fields}
    if self.path:
      with open(self.path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    shown = "  ".join(f"{k}={_short(v)}" for k, v in record.items() if k not in ("row", "phase"))
    print(f"[{self.row}] {phase}: {shown}", flush=True)
    return record


def _short(value: Any) -> str:
  if isinstance(value, float):
    return f"{value:.4g}"
  return str(value)


class CompileLog:
  """Every XLA compile in this process from construction on, each recorded as a `compile` record the moment it ends
  (a row killed in a long compile still shows the programs before it): program name, seconds, whether the
  persistent cache served it, and `during` (what the row was doing: set the attribute). `take()` returns the
  compiles since the previous `take()` as [(name, seconds, cache_hit)]."""

  def __init__(self, record: Recorder):
    import jax  # pylint: disable=g-import-not-at-top
    self.record = record
    self.during = "start"
    self.compiles: list[tuple[str, float, bool]] = []
    self._taken = 0
    self._hits = 0
    jax.monitoring.register_event_listener(self._on_event)
    jax.monitoring.register_event_duration_secs_listener(self._on_duration)

  def _on_event(self, event: str, *args, **kwargs) -> None:  # *args: a later jax may pass more
    del args, kwargs
    if event == CACHE_HIT_EVENT:
      self._hits += 1

  def _on_duration(self, event: str, duration: float, *args, **kwargs) -> None:
    del args
    if event == BACKEND_COMPILE_EVENT:
      name, hit = str(kwargs.get("fun_name", "?")), self._hits > 0
      self._hits = 0
      self.compiles.append((name, float(duration), hit))
      self.record("compile", program=name, seconds=round(float(duration), 3), cache_hit=hit, during=self.during)

  def take(self) -> list[tuple[str, float, bool]]:
    out = self.compiles[self._taken:]
    self._taken = len(self.compiles)
    return out


def backend_info(record: Recorder, import_s: float) -> Any:
  """Initialises the backend (timed) and records JAX's version, the backend and the device kind."""
  import jax  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  devices = jax.devices()
  init_s = time.perf_counter() - start
  record("backend", jax_version=jax.__version__, python=sys.version.split()[0], backend=jax.default_backend(),
         device_kind=devices[0].device_kind, device_count=len(devices), import_s=round(import_s, 3),
         init_s=round(init_s, 3), xla_flags=os.environ.get("XLA_FLAGS", ""),
         mem_fraction=os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", ""),
         preallocate=os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", ""))
  return devices[0]


def enable_compilation_cache(path: str) -> None:
  """JAX's persistent compilation cache in `path`, every executable kept (min compile time 0), so a second run of
  the check shows which programs it serves."""
  from sao.engines import compilation_cache  # pylint: disable=g-import-not-at-top
  compilation_cache.enable(path, max_gb=8.0, min_compile_time_s=0.0, gpu_kernel_cache=True)


def matmul_peak(n: int, repeats: int = 10) -> float:
  """FLOP/s of a jitted `[n, n] @ [n, n]` bfloat16 matmul (float32 accumulation left to XLA), the best of `repeats`
  runs of 4 back-to-back products (one dispatch's overhead amortised)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.bfloat16)
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.bfloat16)

  @jax.jit
  def four(x, y):
    return [x @ (y + i) for i in range(4)]  # distinct operands: XLA cannot merge the four products

  jax.block_until_ready(four(a, b))
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(four(a, b))
    best = min(best, time.perf_counter() - start)
  return 4 * 2.0 * n ** 3 / best


def peak_memory(device: Any) -> dict[str, int | None]:
  """`device.memory_stats()`'s peak and current bytes in use and its limit; None where the backend reports none
  (XLA:CPU)."""
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  stats = stats or {}
  return {"peak_bytes": stats.get("peak_bytes_in_use"), "bytes_in_use": stats.get("bytes_in_use"),
          "bytes_limit": stats.get("bytes_limit")}


def param_count(params: Any) -> int:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def active_params(params: Any, num_experts: int, top_k: int) -> float:
  """Parameters one token runs: every parameter, except that stacked expert weights (leaves with a leading axis of
  `num_experts` under a path naming "expert") count top_k / num_experts of theirs."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  total = 0.0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    size = float(np.prod(leaf.shape))
    name = jax.tree_util.keystr(path).lower()
    if num_experts and "expert" in name and "shared" not in name and leaf.shape and leaf.shape[0] == num_experts:
      size *= top_k / num_experts
    total += size
  return total


def update_flops(p_actor: float, p_critic: float, tokens: int, critic_epochs: int, critic_forwards: int) -> float:
  """One SAO update's FLOPs (the module docstring's convention)."""
  return 6 * p_actor * tokens + critic_epochs * 6 * p_critic * tokens + critic_forwards * 2 * p_critic * tokens


def run_streaming(command: list[str], limit_s: float, on_line, **popen_kwargs) -> tuple[int | None, bool]:
  """Runs `command` in a session of its own, calling `on_line(line)` for each line of its stdout + stderr as it
  comes; at `limit_s` seconds its whole process group gets SIGTERM, then SIGKILL 10 s later. Returns (its exit
  status, whether it was stopped at the limit)."""
  import selectors  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  env = dict(popen_kwargs.pop("env", None) or os.environ, PYTHONUNBUFFERED="1")
  process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             errors="replace", start_new_session=True, env=env, **popen_kwargs)
  selector = selectors.DefaultSelector()
  selector.register(process.stdout, selectors.EVENT_READ)
  start, timed_out = time.perf_counter(), False
  while True:
    left = limit_s - (time.perf_counter() - start)
    if left <= 0:
      timed_out = True
      break
    if not selector.select(timeout=min(left, 1.0)):
      continue
    line = process.stdout.readline()
    if not line:  # end of output: the process (and every child holding the pipe) closed it
      break
    on_line(line.rstrip("\n"))
  if timed_out:
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
      try:
        os.killpg(process.pid, sig)
      except ProcessLookupError:
        break
      try:
        process.wait(wait_s)
        break
      except subprocess.TimeoutExpired:
        continue
  process.wait()
  process.stdout.close()
  return process.returncode, timed_out
