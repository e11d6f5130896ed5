r"""Benchmark: skip-observation GAE + masked whitening, jitted (native, chunked, scan, associative), NumPy loop, copy.

    python experiments/bench/bench_gae.py                      # both sizes, median of 5 timed runs each
    python experiments/bench/bench_gae.py --sizes=64x4096 --repeats=3
    git show e4f743b:sao/core/gae_chunked.py > /tmp/old_gae_chunked.py
    python experiments/bench/bench_gae.py --baseline=/tmp/old_gae_chunked.py --sizes=256x16384 --repeats=41

Prints one table of tokens/s per implementation with its ratio to the NumPy loop (the way verl's reference
`compute_gae_advantage_return` loops over t) and to the copy bound (a jitted pass that reads the same inputs and
writes the same outputs, i.e. the memory floor of any GAE). The "fused" rows are `whitened_gae` (whitening's moments
come out of the GAE pass): with its default method (on the CPU the native kernel, `sao.kernels.gae_cpu`, where it
builds) and with `method="chunked"` (the XLA formulation TPUs run); the native / chunked / scan / associative rows
call `gae` then `masked_whiten`. Three more rows split the pipeline: GAE alone (native, chunked) and `masked_whiten`
alone on precomputed advantages. All numbers come from this one run. `--malloc=keep` (the default) gives the process
the allocator settings the trainer runs with on a CPU host (`sao.engines.host_malloc`: freed memory is reused, so an
output buffer is not page-faulted in again on every call); `--malloc=system` leaves glibc's defaults. `ms` is the median wall time; `cpu ms` the median process CPU time of the same runs
(all threads), which moves less than wall time when other jobs share the cores; "cpu/copy" is the ratio of CPU
times to the copy's. `cpu min` is the least CPU time of the runs, and the last two columns compare those minima
with the loop's and the copy's: on a machine loaded by other jobs the medians of both the kernel and the copy swing
by several times between runs, the minima far less.

`--baseline=FILE` instead compares a `gae_chunked` module loaded from FILE (an earlier version, e.g. from `git show`)
with the current one, interleaved call by call in this process (A B C … A B C …), both behind the same λ and whitening:
fused GAE + whitening, GAE with its returns, the advantages alone, and the copy; CPU ms median / min.
"""
import importlib.util
import os
import sys
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

# the repository, two folders up: this checkout's `sao`
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from sao.core import advantages as adv_lib
from sao.core import gae_chunked
from sao.engines import host_malloc
from sao.kernels import gae_cpu


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import: a module may be imported beside other commands
  whose flags share names)."""
  global _SIZES, _REPEATS, _GAMMA, _BASELINE  # pylint: disable=global-statement
  _SIZES = flags.DEFINE_list("sizes", ["64x4096", "256x16384"], "BxT sizes to time.")
  _REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repetitions per implementation (median reported).")
  _GAMMA = flags.DEFINE_float("gamma", 1.0, "Discount γ.")
  _BASELINE = flags.DEFINE_string("baseline", None, "A gae_chunked.py to compare with the current one, interleaved.")
  global _MALLOC  # pylint: disable=global-statement
  _MALLOC = flags.DEFINE_enum("malloc", "keep", ["keep", "system"],
                              "keep: the trainer's allocator settings (sao.engines.host_malloc); system: glibc's")


def numpy_loop(rewards, values, mask, gamma, lam):
  """GAE the way a straightforward reference does it: a Python loop over t, vectorised over the batch."""
  batch, num_tokens = rewards.shape
  next_value = np.zeros(batch, np.float32)
  last_adv = np.zeros(batch, np.float32)
  advantages = np.zeros_like(rewards)
  for t in reversed(range(num_tokens)):
    m = mask[:, t]
    delta = rewards[:, t] + gamma * next_value - values[:, t]
    a = delta + gamma * lam * last_adv
    next_value = np.where(m, values[:, t], next_value)
    last_adv = np.where(m, a, last_adv)
    advantages[:, t] = np.where(m, a, 0.0)
  returns = np.where(mask, advantages + values, 0.0)
  n = mask.sum()
  mean = advantages[mask].mean()
  var = ((advantages[mask] - mean) ** 2).sum() / n
  return np.where(mask, (advantages - mean) / np.sqrt(var + 1e-8), 0.0), returns


def make_program(method, pipeline="whiten"):
  """Jitted `fn(rewards, values, mask)`: length-adaptive λ, then `gae` with `method` followed by `masked_whiten`
  (`pipeline="whiten"`), `whitened_gae` (`"fused"`) or `gae` alone (`"gae"`)."""
  @jax.jit
  def fn(rewards, values, mask):
    lam = adv_lib.length_adaptive_lambda(mask)
    if pipeline == "fused":
      return adv_lib.whitened_gae(rewards, values, mask, _GAMMA.value, lam, method=method)
    advantages, returns = adv_lib.gae(rewards, values, mask, _GAMMA.value, lam, method=method)
    return (advantages, returns) if pipeline == "gae" else (adv_lib.masked_whiten(advantages, mask), returns)
  return fn


fused = make_program("auto", "fused")
gae_only = make_program("chunked", "gae")


whiten_only = jax.jit(adv_lib.masked_whiten)


@jax.jit
def copy_bound(rewards, values, mask):
  # Reads the same three inputs and writes two float32 outputs of the same size: the memory floor.
  return jnp.where(mask, rewards, 0.0), jnp.where(mask, values, 0.0)


def median_seconds(fn, repeats):
  """(median wall seconds, median process CPU seconds, least CPU seconds) over `repeats` calls after a warm-up."""
  jax.block_until_ready(fn())  # warm up (and compile)
  wall, cpu = [], []
  for _ in range(repeats):
    start, start_cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(fn())
    wall.append(time.perf_counter() - start)
    cpu.append(time.process_time() - start_cpu)
  return float(np.median(wall)), float(np.median(cpu)), float(np.min(cpu))


def inputs(batch, num_tokens, seed=0):
  rng = np.random.default_rng(seed)
  mask = np.zeros((batch, num_tokens), bool)
  for b in range(batch):  # agent-shaped: action runs separated by observation runs
    t = 0
    while t < num_tokens:
      n = int(rng.integers(20, 200))
      mask[b, t:t + n] = True
      t += n + int(rng.integers(20, 400))
  rewards = np.zeros((batch, num_tokens), np.float32)
  rewards[np.arange(batch), num_tokens - 1 - np.argmax(mask[:, ::-1], axis=1)] = rng.random(batch) < 0.5
  values = rng.random((batch, num_tokens)).astype(np.float32)
  return rewards, values, mask


def kernel_programs(module):
  """Jitted `{name: fn(rewards, values, mask)}` of one gae_chunked module behind the same λ and whitening."""
  gamma = jnp.float32(_GAMMA.value)

  def fused_whiten(rewards, values, mask):
    lam = adv_lib.length_adaptive_lambda(mask)
    adv, ret, (count, mean, sum_sq) = module.advantages_returns_and_moments(rewards, values, mask, gamma,
                                                                          gamma * lam)
    var = jnp.where(count > 0, sum_sq / jnp.maximum(count, 1.0), 0.0)
    return jnp.where(mask, (adv - mean) * jax.lax.rsqrt(var + 1e-8), 0.0), ret

  def with_returns(rewards, values, mask):
    return module.advantages_and_returns(rewards, values, mask, gamma, gamma * adv_lib.length_adaptive_lambda(mask))

  return {"fused GAE+whiten": jax.jit(fused_whiten), "GAE alone (A, R)": jax.jit(with_returns),
          "GAE, A only": jax.jit(lambda *args: with_returns(*args)[0])}


def compare_with_baseline(path):
  spec = importlib.util.spec_from_file_location("baseline_gae_chunked", path)
  if spec is None:
    raise ValueError(f"--baseline: cannot load {path!r} as a Python module")
  baseline = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(baseline)
  programs = {}
  for label, module in (("old", baseline), ("new", gae_chunked)):
    programs.update({f"{label} {name}": fn for name, fn in kernel_programs(module).items()})
  programs["copy (memory bound)"] = copy_bound
  for size in _SIZES.value:
    batch, num_tokens = (int(v) for v in size.split("x"))
    args = [jax.device_put(a) for a in inputs(batch, num_tokens)]
    for fn in programs.values():
      jax.block_until_ready(fn(*args))
    cpu = {name: [] for name in programs}
    load = os.getloadavg()[0]
    for _ in range(_REPEATS.value):
      for name, fn in programs.items():
        start = time.process_time()
        jax.block_until_ready(fn(*args))
        cpu[name].append(time.process_time() - start)
    print(f"{size}: {_REPEATS.value} interleaved calls each, load average {load:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"CPU ms median / min (old: {path})")
    for name, seconds in cpu.items():
      print(f"{name:>24}: {np.median(seconds) * 1e3:8.2f} / {np.min(seconds) * 1e3:7.2f}")


def main(argv):
  del argv
  if _MALLOC.value == "keep":  # before the first computation starts XLA's threads
    host_malloc.keep_freed_memory({host_malloc.ENV: host_malloc.KEEP})
  if _BASELINE.value:
    compare_with_baseline(_BASELINE.value)
    return
  print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({jax.device_count()} device(s)); median of "
        f"{_REPEATS.value} runs after warm-up; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
        f"malloc {_MALLOC.value}")
  header = (f"{'B x T':>12} {'implementation':>30} {'ms':>9} {'cpu ms':>9} {'Mtok/s':>9} {'vs loop':>9} "
            f"{'vs copy':>9} {'cpu/copy':>9} {'cpu min':>9} {'min:loop':>9} {'min:copy':>9}")
  print(header)
  print("-" * len(header))
  for size in _SIZES.value:
    batch, num_tokens = (int(v) for v in size.split("x"))
    rewards, values, mask = inputs(batch, num_tokens)
    device_args = [jax.device_put(a) for a in (rewards, values, mask)]
    lam = np.asarray(adv_lib.length_adaptive_lambda(mask))
    timings = {
        "numpy loop over t": median_seconds(lambda: numpy_loop(rewards, values, mask, _GAMMA.value, lam),
                                            max(1, _REPEATS.value // 2)),
    }
    native = gae_cpu.available()
    timings[f"jax gae+whiten fused ({'native' if native else 'auto'})"] = median_seconds(
        lambda: fused(*device_args), _REPEATS.value)
    fused_chunked = make_program("chunked", "fused")
    timings["jax gae+whiten fused chunked"] = median_seconds(lambda: fused_chunked(*device_args), _REPEATS.value)
    for method in ("native", "chunked", "scan", "associative")[0 if native else 1:]:
      fn = make_program(method)
      timings[f"jax gae+whiten {method}"] = median_seconds(lambda: fn(*device_args), _REPEATS.value)
    if native:
      native_only = make_program("native", "gae")
      timings["  gae alone (native)"] = median_seconds(lambda: native_only(*device_args), _REPEATS.value)
    timings["  gae alone (chunked)"] = median_seconds(lambda: gae_only(*device_args), _REPEATS.value)
    advantages = gae_only(*device_args)[0]
    timings["  masked_whiten alone"] = median_seconds(lambda: whiten_only(advantages, device_args[2]),
                                                      _REPEATS.value)
    timings["copy (memory bound)"] = median_seconds(lambda: copy_bound(*device_args), _REPEATS.value)
    tokens = batch * num_tokens
    loop, _, loop_min = timings["numpy loop over t"]
    copy, copy_cpu, copy_min = timings["copy (memory bound)"]
    for name, (seconds, cpu_seconds, cpu_min) in timings.items():
      print(f"{size:>12} {name:>30} {seconds * 1e3:>9.2f} {cpu_seconds * 1e3:>9.2f} {tokens / seconds / 1e6:>9.1f} "
            f"{loop / seconds:>8.1f}x {seconds / copy:>8.2f}x {cpu_seconds / copy_cpu:>8.2f}x {cpu_min * 1e3:>9.2f} "
            f"{loop_min / cpu_min:>8.1f}x {cpu_min / copy_min:>8.2f}x")


if __name__ == "__main__":
  define_flags()
  app.run(main)
