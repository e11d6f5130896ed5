"""One run of an experiment config in its role (`config.role`); `experiments/train.py` parses flags and calls `run`.

- embedded: the trainer plus its engines and rollout workers as child processes on this machine
  (`launch.embedded`);
- trainer: the trainer alone (workers on other hosts connect to `server.host:server.port`; engines are
  `engine_urls`);
- worker: a rollout worker in this process, for the trainer at `trainer_address`.

A trainer (embedded or alone) may be one process of a P-process trainer job (docs/tpu.md, "Multi-host trainer"):
with `distributed.num_processes` > 1 it joins the job at `distributed.coordinator_address` as
`distributed.process_id` (CPU hosts, `launch.local --trainer_processes`); with `jax_distributed` JAX detects the
job itself (TPU pods). Only process 0 starts engines and workers, plots the curves and prints the summary. A lost
process ends every other one with exit code `sao.train.coordination.EXIT_PROCESS_LOST` and a message naming it.

Before anything starts, the config is checked the way the processes will use it (`check_startable`): the
environment is built from `env.kwargs` (a keyword it does not take is an error naming it), its task lists are
loaded (missing data is an error naming the file and the config keys that point at it), and the harness names are
looked up in the registry (an unknown one is an error listing the registered ones).
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys
import traceback
from typing import Callable, Sequence

import ml_collections

from sao import run_config
from sao.engines import compilation_cache
from sao.engines import gpu_share, host_malloc
from sao.engines import xla_cpu_threads
from sao.rollout import envs
from sao.rollout import harnesses as harness_lib

ROLES = ("embedded", "trainer", "worker")


def make_env(config: ml_collections.ConfigDict) -> envs.Env:
  """The config's environment; ValueError naming the keyword when `env.kwargs` holds one the environment lacks."""
  kwargs = dict(config.env.kwargs)
  try:
    return envs.make(config.env.name, **kwargs)
  except TypeError as e:
    raise ValueError(f"{config.name}: env.kwargs {sorted(kwargs)} do not fit the {config.env.name!r} environment: "
                     f"{e}") from e


def task_lists(config: ml_collections.ConfigDict) -> tuple[list[dict], list[dict]]:
  """(training tasks, validation tasks); missing data is a FileNotFoundError naming it and what to pass instead."""
  env = make_env(config)
  try:
    return (env.tasks("train", config.env.num_train_tasks, config.seed),
            env.tasks("validation", config.env.num_validation_tasks, config.seed + 1))
  except (OSError, ValueError) as e:
    if "no such file" not in str(e).lower() and not isinstance(e, FileNotFoundError):
      raise
    raise FileNotFoundError(
        f"{config.name}: the {config.env.name!r} environment cannot load its tasks: {e}. Prepare the data there, or "
        f"point the config at it with --config.env.kwargs.<key>=<path> (env.kwargs now: "
        f"{dict(config.env.kwargs)}; the config file's docstring names the data)") from e


def harness_mixture(config: ml_collections.ConfigDict) -> harness_lib.HarnessMixture:
  """The rollout workers' harness mixture (an unregistered name is a ValueError listing the registered ones)."""
  from sao.rollout import worker as worker_lib  # pylint: disable=g-import-not-at-top
  r = config.rollout
  try:
    return worker_lib.worker_config(config, trainer_address="").harness_mixture  # the workers' own rule
  except ValueError as e:
    raise ValueError(f"{config.name}: rollout.harnesses {tuple(r.harnesses)}: {e}. Register the missing harness "
                     f"(`sao.rollout.harnesses.register`) or pass registered names with "
                     f"--config.rollout.harnesses=... (and rollout.harness_weights, rollout.eval_harness)") from e


def check_startable(config: ml_collections.ConfigDict) -> tuple[list[dict], list[dict]]:
  """Everything a run needs before its processes start (module docstring); returns the task lists."""
  if config.role not in ROLES:
    raise ValueError(f"config.role: unknown role {config.role!r} ({' | '.join(ROLES)})")
  harness_mixture(config)
  return task_lists(config)


def tokenizer(config: ml_collections.ConfigDict):
  from sao.models.tokenizer import Tokenizer, toy_tokenizer  # pylint: disable=g-import-not-at-top
  path = run_config.tokenizer_path(config)
  return Tokenizer.from_pretrained(path) if path else toy_tokenizer()


def _demonstrations(config: ml_collections.ConfigDict, tok) -> Callable[[], list]:
  def demonstrations():
    from sao.rollout.demonstrations import demonstration_trajectories  # pylint: disable=g-import-not-at-top
    r = config.recipe
    return demonstration_trajectories(config.env.name, tok, r.num_demonstrations, config.seed,
                                      noise=r.demonstration_noise, env_kwargs=dict(config.env.kwargs),
                                      harnesses=tuple(config.rollout.harnesses),
                                      harness_weights=tuple(config.rollout.harness_weights))
  return demonstrations


def join_job(config: ml_collections.ConfigDict) -> bool:
  """Joins this process to its multi-process trainer job, if the config describes one (explicit coordinates for CPU
  hosts, or `jax_distributed` auto-detection on TPU); returns whether it did. ValueError on inconsistent keys."""
  d = config.distributed
  if d.num_processes < 1 or not 0 <= d.process_id < d.num_processes:
    raise ValueError(f"config.distributed: process_id {d.process_id} must be in [0, num_processes="
                     f"{d.num_processes})")
  if d.num_processes > 1 and not d.coordinator_address:
    raise ValueError(f"config.distributed.num_processes={d.num_processes} needs distributed.coordinator_address "
                     "(process 0's host:port)")
  if d.num_processes > 1 and config.jax_distributed:
    raise ValueError("config: give either jax_distributed (TPU auto-detection) or distributed.num_processes > 1 "
                     "(explicit coordinates), not both")
  if d.num_processes == 1 and not config.jax_distributed:
    return False
  from sao.train import distributed  # pylint: disable=g-import-not-at-top
  # The coordination service's own heartbeat aborts a process; ours (sao.train.coordination) names the lost one
  # and stops cleanly, so it must fire first.
  service_timeout = int(max(3 * d.heartbeat_timeout_s, d.heartbeat_timeout_s + 30))
  if d.num_processes > 1:
    distributed.initialize(d.coordinator_address, d.num_processes, d.process_id, heartbeat_timeout_s=service_timeout)
  else:
    distributed.initialize(heartbeat_timeout_s=service_timeout)
  return True


def local_engines(config: ml_collections.ConfigDict) -> int:
  """How many local JAX engines this process starts (and shares its host's GPU with)."""
  return config.num_engines if config.role == "embedded" and not config.engine_urls else 0


def train(config: ml_collections.ConfigDict, workdir: str, config_args: Sequence[str]) -> None:
  """The trainer role (embedded or alone): the recipe's phases, then the curves and a one-line summary."""
  train_tasks, validation_tasks = check_startable(config)
  from sao.train import coordination, stop_signal  # pylint: disable=g-import-not-at-top
  # Before JAX starts its GPU client: trainer and local engines sharing a GPU each get a memory share, not 75 % each
  # (sao.engines.gpu_share; nothing on a CPU host or over the user's own XLA_PYTHON_CLIENT_* settings).
  shared = gpu_share.apply("trainer", local_engines(config))
  multi = join_job(config)
  xla_cpu_threads.limit(config.xla_cpu_threads)  # after jax.distributed joins, before the first computation
  if shared:
    print(f"[trainer] GPU shared with {local_engines(config)} local engine(s): "
          f"{' '.join(f'{k}={v}' for k, v in shared.items())}", flush=True)
  d = config.distributed
  channel = coordination.create(d.heartbeat_timeout_s, stall_compile_budget_s=d.stall_compile_budget_s,
                                stall_step_factor=d.stall_step_factor) if multi else coordination.LocalChannel()
  stop = stop_signal.StopSignal.install(d.stop_grace_s, channel.phase)  # SIGTERM: stop at a step boundary
  try:
    _train(config, workdir, config_args, channel, train_tasks, validation_tasks, stop)
  except stop_signal.StopRequested as e:
    stop.exited()
    print(f"[trainer] process {channel.process_id}: {e}", file=sys.stderr, flush=True)
    channel.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(stop_signal.EXIT_SIGTERM)  # pylint: disable=protected-access  (as below: no wait for the others)
  except BaseException as e:  # noqa: BLE001 — re-raised, or the process ends here
    if channel.num_processes == 1:
      raise
    # Ends the process now: at interpreter exit the distributed client would wait for the lost process.
    if isinstance(e, coordination.ProcessLost):
      print(f"[trainer] process {channel.process_id}: {e}", file=sys.stderr, flush=True)
    else:
      traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(coordination.EXIT_PROCESS_LOST if isinstance(e, coordination.ProcessLost) else 1)
  finally:
    stop.exited()
    channel.close()


def _train(config: ml_collections.ConfigDict, workdir: str, config_args: Sequence[str], channel,
           train_tasks: list[dict], validation_tasks: list[dict], stop=None) -> None:
  from sao.analysis import curves  # pylint: disable=g-import-not-at-top
  from sao.train import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  _persistent_compilation_cache(config, workdir)
  tok = tokenizer(config)
  if not channel.is_coordinator:  # engines and workers are process 0's
    launcher = trainer_lib.Launcher(lambda _: list(config.engine_urls), lambda address: None)
  elif config.role == "embedded":
    from launch import embedded  # pylint: disable=g-import-not-at-top
    children = embedded.EmbeddedProcesses(config, workdir, config_args)
    launcher = trainer_lib.Launcher(children.start_engines, children.start_workers, children.stop,
                                    children.check_alive)
  else:  # the trainer alone: engines and workers are someone else's
    launcher = trainer_lib.Launcher(lambda _: list(config.engine_urls), lambda address: None)
  trainer = trainer_lib.Trainer(config, workdir, tok, train_tasks, validation_tasks, channel, stop)
  summary = trainer.run(launcher, _demonstrations(config, tok) if config.recipe.sft_steps else None)
  if not channel.is_coordinator:
    return
  png = curves.plot_training_curves(os.path.join(workdir, "metrics.jsonl"), os.path.join(workdir, "curves.png"))
  from sao.train import progress  # pylint: disable=g-import-not-at-top
  print(f"[done] {config.name}: {progress.validation_line(trainer.validations)}; last step {summary}; "
        f"curves: {png}", flush=True)


def _persistent_compilation_cache(config: ml_collections.ConfigDict, workdir: str) -> None:
  """XLA executables cached in `<compilation_cache_dir>/trainer` (`sao.engines.compilation_cache`; every process of
  a job reads, process 0 writes): a later run of the same programs, or a resumed one, loads the learner's instead
  of compiling them (docs/performance_job.md). A cache the user configured for JAX itself (`JAX_COMPILATION_CACHE_DIR`)
  is left as it is."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.config.jax_compilation_cache_dir:
    return
  compilation_cache.enable(
      compilation_cache.trainer_dir(compilation_cache.run_dir(config.compilation_cache_dir, workdir)),
      config.compilation_cache_max_gb, min_compile_time_s=0.0,
      gpu_kernel_cache=config.distributed.num_processes == 1 and not config.jax_distributed)


def work(config: ml_collections.ConfigDict, trainer_address: str, worker_index: int | None = None) -> dict[str, int]:
  """The worker role: one rollout worker in this process until SIGTERM/SIGINT; returns its stats."""
  if not trainer_address:
    raise ValueError("role=worker needs the trainer's address (--trainer=host:port)")
  harness_mixture(config)
  from sao.rollout import worker as worker_lib  # pylint: disable=g-import-not-at-top
  logging.getLogger("sao.rollout").setLevel(logging.INFO)
  return asyncio.run(worker_lib.serve(worker_lib.worker_config(config, trainer_address, worker_index)))


def run(config: ml_collections.ConfigDict, workdir: str, config_args: Sequence[str], trainer_address: str = "",
        worker_index: int | None = None) -> None:
  """Runs `config` in its role. `config_args` are the command line's config flags (`config_flag_args`), which
  embedded workers are started with."""
  if config.role == "worker":
    work(config, trainer_address, worker_index)
  elif config.role in ROLES:
    # Before JAX starts its thread pools: XLA:CPU's per-update buffers are reused instead of page-faulted in again
    # (sao.engines.host_malloc; not on accelerator hosts; `SAO_HOST_MALLOC=system` opts out, for this process and
    # the engines it starts).
    host_malloc.keep_freed_memory()
    train(config, workdir, config_args)
  else:
    raise ValueError(f"config.role: unknown role {config.role!r} ({' | '.join(ROLES)})")


def config_flag_args(config_flag) -> list[str]:
  """The `--config=<file>:<arg>` and `--config.<key>=<value>` flags a config flag (ml_collections
  `DEFINE_config_file`) was given, normalised, so that another process parses them to the same config."""
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  return [f"--config={config_flags.get_config_filename(config_flag)}",
          *run_config.override_flags(config_flags.get_override_values(config_flag))]
