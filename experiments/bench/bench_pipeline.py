r"""Pipeline throughput: SAO fully asynchronous vs synchronous, on a toy task with heavy-tailed episode durations.

    python experiments/bench/bench_pipeline.py [--steps=6] [--batch_size=16] [--delay_pareto_alpha=1.2]
        [--critic_epochs=K]

Both modes run the real trainer (`sao.train.trainer.Trainer`: gRPC service, task dispenser, learner, weight
publishing) against one local JAX engine and one rollout worker process, on `slow_number_search`: number search
whose episodes each sleep `scale * Pareto(alpha)` seconds (a few episodes take far longer than the median, like SWE
containers and test suites).

- async: the SAO default. Workers keep `concurrency` episodes in flight at all times; every step trains on the
  first `batch_size` trajectories to finish, whichever they are.
- sync: the dispenser leases exactly `batch_size` tasks per step and no more until the learner has taken that
  step's batch, i.e. the learner waits for every rollout of the step (the slowest one included), and no rollout
  runs while it trains.

Reported per mode over the measured steps (after `--warmup_steps`, which absorb JIT compilation): trajectories/s
trained on, and the trainer's busy fraction (time not spent waiting for a batch / wall time). Then the async/sync
ratios. Also measured (and written with `--out=<file>.json`, which `experiments/simulate_fleet.py --validate` reads):
the staleness of every trained trajectory as the trainer counts it (learner version − the trajectory's policy
version, at the step that takes it), each step's training time, each training episode's wall time from lease to
acceptance, the mean turns and the agent loop's timings (engine, env steps, total), and the load average
(`os.getloadavg`) before and after: the machine may be shared. Compilation goes to a persistent JAX cache shared by
both modes and the engine, and the second mode reuses the first one's base policy and engine.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from absl import app, flags

# the repository, two folders up: `experiments.configs` and this checkout's `sao`
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.bench import pipeline_recording  # noqa: E402


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import: tests import every command in one process, and
  commands share flag names, e.g. `--config`, `--out`, `--batch`)."""
  global _WORKDIR, _MODES, _STEPS, _WARMUP, _BATCH, _CONCURRENCY, _ALPHA, _SCALE  # pylint: disable=global-statement
  global _MAX_DELAY, _N, _SFT_STEPS, _CRITIC_EPOCHS, _CACHE, _OUT  # pylint: disable=global-statement
  _WORKDIR = flags.DEFINE_string("workdir", "/tmp/sao_bench_pipeline", "Scratch directory (wiped per mode).")
  _MODES = flags.DEFINE_list("modes", ["async", "sync"], "Modes to run, in order.")
  _STEPS = flags.DEFINE_integer("steps", 6, "Measured learner steps per mode.")
  _WARMUP = flags.DEFINE_integer("warmup_steps", 2, "Unmeasured learner steps first (JIT compilation).")
  _BATCH = flags.DEFINE_integer("batch_size", 16, "Trajectories per learner step.")
  _CONCURRENCY = flags.DEFINE_integer("concurrency", 16, "Agent loops in the rollout worker.")
  _ALPHA = flags.DEFINE_float("delay_pareto_alpha", 1.2, "Tail index of the per-episode delay (smaller: heavier).")
  _SCALE = flags.DEFINE_float("delay_scale_s", 0.5, "Minimum (and scale) of the per-episode delay, seconds.")
  _MAX_DELAY = flags.DEFINE_float("delay_max_s", 30.0, "Cap on the per-episode delay, seconds.")
  _N = flags.DEFINE_integer("n", 16, "number_search range 1..n (n=16: 6-turn budget).")
  _SFT_STEPS = flags.DEFINE_integer("sft_steps", 5, "Supervised warm-start steps of the toy base policy.")
  _CRITIC_EPOCHS = flags.DEFINE_integer(
      "critic_epochs", 0, "SAO critic epochs per learner step (0 = the toy config's own, 2). More epochs make the "
      "trainer's step longer with real work and leave the rollout side as it is: the engine serves the actor, "
      "never the critic. How to measure a trainer-bound fleet (docs/fleet_simulation.md, 'a busy trainer').")
  _CACHE = flags.DEFINE_string("jax_cache_dir", "", "Persistent compilation cache ('' = <workdir>/jax_cache).")
  _OUT = flags.DEFINE_string("out", "", "Write every mode's measurements (distributions included) to this JSON file.")


# experiments/configs/, one folder up from this script: the file the rollout worker process loads
_CONFIG_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "sao_openswe.py")


def config_arg(total_steps: int, sft_steps: int, batch_size: int, concurrency: int, critic_epochs: int = 0) -> str:
  """The bench's settings as a `sao_openswe.py` config arg (the rollout worker is started with the same one).
  `critic_epochs` > 0 overrides the toy config's K critic epochs per learner step; 0 keeps the config's own."""
  if critic_epochs < 0:
    raise ValueError(f"critic_epochs must be >= 0 (0 = the config's own), got {critic_epochs}")
  arg = (f"toy,total_steps={total_steps},recipe.sft_steps={sft_steps},recipe.num_demonstrations=50,"
         f"recipe.value_pretrain_steps=0,learner.sao.critic_warmup_steps=1,rollout.batch_size={batch_size},"
         f"rollout.concurrency={concurrency},rollout.max_new_tokens=16,rollout.max_total_tokens=160,"
         f"rollout.eval_every=0,env.num_validation_tasks=1,checkpoint_every=100000,log_every=1,"
         f"server.buffer_capacity={4 * batch_size}")
  return arg + (f",learner.sao.critic_epochs={critic_epochs}" if critic_epochs else "")


def _config_arg() -> str:
  return config_arg(_WARMUP.value + _STEPS.value, _SFT_STEPS.value, _BATCH.value, _CONCURRENCY.value,
                    _CRITIC_EPOCHS.value)


def _config(mode: str):
  from experiments.configs import sao_openswe  # pylint: disable=g-import-not-at-top
  config = sao_openswe.get_config(_config_arg())
  config.unlock()
  config.name = f"bench_pipeline_{mode}"
  config.env.name = "slow_number_search"
  config.env.kwargs = dict(n=_N.value, delay_pareto_alpha=_ALPHA.value, delay_scale_s=_SCALE.value,
                           delay_max_s=_MAX_DELAY.value)
  config.lock()
  return config


class _Processes:
  """One local engine shared by the modes (reset to the base policy per mode) and one worker process per mode."""

  def __init__(self, config, log_dir: str, env: dict[str, str]):
    self.config = config
    self.log_dir = log_dir
    self.env = env
    self.engine = None
    self.url = ""
    self.worker: subprocess.Popen | None = None
    self.watch: pipeline_recording.EngineVersionWatch | None = None

  def start_engines(self, model_dir: str) -> list[str]:
    from sao.engines.local_server import start_local_engine  # pylint: disable=g-import-not-at-top
    from sao.train import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
    c = self.config
    if self.engine is None:
      self.engine, self.url = start_local_engine(
          model_dir, log_path=os.path.join(self.log_dir, "engine.log"), env=self.env, startup_timeout_s=600,
          engine_args=[f"--max_batch_size={c.rollout.concurrency}", "--batch_window_ms=3",
                       f"--new_token_buckets={c.rollout.max_new_tokens}", "--prompt_buckets=64,128,160"])
    else:  # back to the base policy, version 0, as a fresh run would see it
      asyncio.run(trainer_lib._publish([self.url], model_dir, 0))  # pylint: disable=protected-access
    return [self.url]

  def start_workers(self, address: str) -> None:
    from launch import embedded  # pylint: disable=g-import-not-at-top
    from sao.rollout import worker as worker_lib  # pylint: disable=g-import-not-at-top
    c = self.config
    self.watch = pipeline_recording.EngineVersionWatch(self.url)  # the engine is up and on version 0 for this mode
    # The worker reads the toy config with the bench's settings; the leased tasks name `slow_number_search`, whose
    # episodes need no constructor kwargs (each task carries its delay).
    with open(os.path.join(self.log_dir, f"worker_{c.name}.log"), "ab") as log_file:
      self.worker = subprocess.Popen(
          worker_lib.command([f"--config={_CONFIG_FILE}:{_config_arg()}"], address),
          stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=embedded.child_env(self.env))

  def check_alive(self) -> None:
    if self.engine is not None and not self.engine.alive():
      raise RuntimeError(f"engine died; log tail:\n{self.engine.log_tail()}")
    if self.worker is not None and self.worker.poll() is not None:
      raise RuntimeError(f"rollout worker exited with code {self.worker.returncode}")

  def stop_worker(self) -> None:
    if self.watch is not None:
      self.watch.stop()  # its record stays for the mode's summary
    if self.worker is not None and self.worker.poll() is None:
      self.worker.terminate()
      try:
        self.worker.wait(timeout=20)
      except subprocess.TimeoutExpired:
        self.worker.kill()
        self.worker.wait(timeout=20)
    self.worker = None

  def stop(self) -> None:
    self.stop_worker()
    if self.engine is not None:
      self.engine.stop()
      self.engine = None


def _run_mode(mode: str, processes: _Processes, base_dir: str | None) -> dict[str, Any]:
  from sao.models.tokenizer import toy_tokenizer  # pylint: disable=g-import-not-at-top
  from sao.rollout import envs  # pylint: disable=g-import-not-at-top
  from sao.rollout.demonstrations import demonstration_trajectories  # pylint: disable=g-import-not-at-top
  from sao.train import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  config = _config(mode)
  processes.config = config
  workdir = os.path.join(_WORKDIR.value, mode)
  shutil.rmtree(workdir, ignore_errors=True)  # a leftover checkpoint would make this a resume
  os.makedirs(workdir)
  if base_dir is not None:
    shutil.copytree(base_dir, os.path.join(workdir, "base_model"))
  tokenizer = toy_tokenizer()
  env = envs.make(config.env.name, **config.env.kwargs)
  train_tasks = env.tasks("train", config.env.num_train_tasks, config.seed)
  validation_tasks = env.tasks("validation", config.env.num_validation_tasks, config.seed + 1)

  def demonstrations():
    r = config.recipe
    return demonstration_trajectories(config.env.name, tokenizer, r.num_demonstrations, config.seed,
                                      noise=r.demonstration_noise, env_kwargs=dict(config.env.kwargs))

  trainer = pipeline_recording.bench_trainer_class()(config, workdir, tokenizer, train_tasks, validation_tasks,
                                                     sync=mode == "sync")
  launcher = trainer_lib.Launcher(processes.start_engines, processes.start_workers, processes.stop_worker,
                                  processes.check_alive)
  print(f"[bench] {mode}: {_WARMUP.value} warmup + {_STEPS.value} measured steps of {config.rollout.batch_size} "
        f"trajectories, {config.rollout.concurrency} agent loops", flush=True)
  load_before = os.getloadavg()
  trainer.run(launcher, demonstrations if config.recipe.sft_steps else None)
  warmup = _WARMUP.value
  engine_changes = processes.watch.changes if processes.watch is not None else []
  return {**pipeline_recording.summarize_mode(mode, trainer, engine_changes, warmup, config.rollout.batch_size),
          "concurrency": _CONCURRENCY.value, "batch_size": _BATCH.value,
          "max_outstanding": config.server.max_outstanding, "buffer_capacity": config.server.buffer_capacity,
          "max_staleness": config.server.max_staleness, "warmup_steps": warmup,
          "critic_epochs": config.learner.sao.critic_epochs,
          "delay": {"kind": "pareto", "alpha": _ALPHA.value, "scale_s": _SCALE.value, "max_s": _MAX_DELAY.value},
          "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
          "base_dir": os.path.join(workdir, "base_model")}


def main(argv):
  del argv
  # SIGTERM must run the `finally` below, or the engine and worker subprocesses outlive the benchmark.
  signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
  os.makedirs(_WORKDIR.value, exist_ok=True)
  cache = _CACHE.value or os.path.join(_WORKDIR.value, "jax_cache")
  env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"), JAX_COMPILATION_CACHE_DIR=cache,
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  os.environ.update(env)  # this process's JAX reads them at first use
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_compilation_cache_dir", cache)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  processes = _Processes(None, _WORKDIR.value, env)
  results, base_dir = [], None
  start = time.monotonic()
  try:
    for mode in _MODES.value:
      if mode not in ("async", "sync"):
        raise app.UsageError(f"--modes: unknown mode {mode!r} (async | sync)")
      result = _run_mode(mode, processes, base_dir)
      base_dir = base_dir or result["base_dir"]
      results.append(result)
      print(f"[bench] {mode}: {result['traj_per_s']:.2f} trajectories/s, trainer busy {result['busy']:.1%} "
            f"({result['steps']} steps in {result['wall_s']:.1f}s; {result['stale_rejected']} rejected as stale)",
            flush=True)
      print(f"[bench] {mode}: staleness mean {result['staleness_mean']:.2f}, train step "
            f"{sum(result['train_step_s']) / len(result['train_step_s']):.2f}s, load average "
            f"{result['loadavg_before'][0]:.1f} → {result['loadavg_after'][0]:.1f}", flush=True)
  finally:
    processes.stop()
  if _OUT.value:
    with open(_OUT.value, "w", encoding="utf-8") as f:
      json.dump([{k: v for k, v in r.items() if k != "base_dir"} for r in results], f, indent=1)
  print(f"\nslow_number_search n={_N.value}, delay {_SCALE.value}s × Pareto(α={_ALPHA.value}) "
        f"(cap {_MAX_DELAY.value}s), batch {_BATCH.value}, {_CONCURRENCY.value} agent loops; "
        f"total {time.monotonic() - start:.0f}s")
  print(f"{'mode':<6} {'traj/s':>8} {'busy':>7} {'wall_s':>7}")
  for r in results:
    print(f"{r['mode']:<6} {r['traj_per_s']:8.2f} {r['busy']:7.1%} {r['wall_s']:7.1f}")
  by_mode = {r["mode"]: r for r in results}
  if "async" in by_mode and "sync" in by_mode:
    a, s = by_mode["async"], by_mode["sync"]
    print(f"async/sync: throughput × {a['traj_per_s'] / s['traj_per_s']:.2f}, busy fraction × "
          f"{a['busy'] / max(s['busy'], 1e-9):.2f}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
