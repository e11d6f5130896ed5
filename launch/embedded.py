"""The embedded run's child processes: local JAX engine servers and rollout workers on this machine, over loopback.

`EmbeddedProcesses` starts `config.num_engines` engines (`python -m sao.engines.serve`, unless the config names
external `engine_urls`) and `config.num_workers` rollout workers (`python -m sao.rollout.worker`, reading the
trainer's own `--config` flags), logs under `<workdir>/logs/`. With more than one engine, `sglang-router`
(`sao.engines.router`, policy `ROUTER_POLICY`) runs in front of them and its URL is the only one the workers get;
the trainer publishes weights to every engine behind it (`sao.engines.fleet`). One engine is talked to directly.

A rollout worker that dies is restarted (its leases expire and the trainer re-leases their tasks), at most
`MAX_WORKER_RESTARTS` times per run in total. Behind a router, an engine that dies is reported and the run goes on
with the others (the router retries the requests it refused on another engine; the next publish takes the dead one
out of the router's rotation); the run stops when the last engine or the router dies. A lone engine's death stops
the run. Each child is a `sao.engines.processes.ChildProcess`: its own process group, ended with the launcher.
"""
from __future__ import annotations

import os
from typing import Sequence

import ml_collections

from sao.engines import compilation_cache
from sao.engines import gpu_share
from sao.engines import processes
from sao.rollout import worker as worker_lib

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_WORKER_RESTARTS = 10  # a worker that keeps dying is a bug to surface, not a fault to ride out
# Production's default (`launch.sglang_fleet`): a multi-turn episode's next request tends to go to the engine that
# holds its prefix.
ROUTER_POLICY = "cache_aware"


# XLA:CPU runs the local engine's prefill-and-decode program 1.3-1.5x slower per row from 32 rows up (the toy model:
# 1.2-1.4 CPU ms a row at 24-31 rows, 1.5-1.8 at 32-64; `experiments/bench/bench_engine_rows.py`,
# docs/performance_rollout.md, "The engine's batches": at 32 rows XLA:CPU stops handing several of the prefill's dots to
# YNNPACK): its batches stop below that, and a burst of more rows is served as several batches.
MAX_BATCH_ROWS = 31


def max_batch_rows(concurrency: int) -> int:
  """Rows per engine batch: the worker's concurrency, at most `MAX_BATCH_ROWS`."""
  return max(1, min(concurrency, MAX_BATCH_ROWS))


def batch_buckets(concurrency: int) -> list[int]:
  """The engine's batch shapes (each one is a compile): a quarter, half, three quarters and all of
  `max_batch_rows` (deduplicated), so a batch pads at most a quarter of the largest."""
  top = max_batch_rows(concurrency)
  return sorted({max(1, top // 4), max(1, top // 2), max(1, 3 * top // 4), top})


def prompt_buckets(max_total_tokens: int) -> list[int]:
  """The engine's prompt lengths: powers of two from 64 below `max_total_tokens`, then `max_total_tokens` itself."""
  buckets, b = [], 64
  while b < max_total_tokens:
    buckets.append(b)
    b *= 2
  return buckets + [max_total_tokens]


# A later turn's request prefills only what its cached prefix does not cover: the toy's are 5-10 tokens (an
# observation and the chat template's turn markers), and a 64-slot suffix made a 24-row batch cost 1.5x what a
# 16-slot one does (docs/performance_rollout.md, "The engine's batches").
SHORT_SUFFIX_BUCKETS = (16, 32)


def suffix_buckets(max_total_tokens: int) -> list[int]:
  """The engine's buckets of a prompt's uncached suffix: `SHORT_SUFFIX_BUCKETS` below the smallest prompt bucket,
  then the prompt buckets (a request without a cached prefix prefills its whole prompt)."""
  prompts = prompt_buckets(max_total_tokens)
  return [b for b in SHORT_SUFFIX_BUCKETS if b < prompts[0]] + prompts


def engine_args(config: ml_collections.ConfigDict, cache_dir: str) -> list[str]:
  """The `sao.engines.serve` flags that fit the run's rollouts: every agent loop of a worker in one batch, the
  episode's token budget as the longest prompt, the config's queue bound (`engine_max_queued_rows`), a
  persistent compilation cache in `cache_dir` bounded by `compilation_cache_max_gb`, and the config's
  `xla_cpu_threads`."""
  r = config.rollout
  if config.engine_max_queued_rows < 1:  # here, not in the engine's log after it failed to start
    raise ValueError(f"engine_max_queued_rows: must be >= 1, got {config.engine_max_queued_rows}")
  return [f"--max_batch_size={max_batch_rows(r.concurrency)}", "--batch_window_ms=5",
          f"--max_queued_rows={config.engine_max_queued_rows}",
          f"--new_token_buckets={r.max_new_tokens}",
          f"--batch_buckets={','.join(str(b) for b in batch_buckets(r.concurrency))}",
          f"--prompt_buckets={','.join(str(b) for b in prompt_buckets(r.max_total_tokens))}",
          f"--suffix_buckets={','.join(str(b) for b in suffix_buckets(r.max_total_tokens))}",
          # Each (batch, prompt) bucket compiles once; the persistent cache makes a resumed run or the next
          # experiment start in seconds.
          f"--compilation_cache_dir={cache_dir}",
          f"--compilation_cache_max_gb={config.compilation_cache_max_gb}",
          f"--xla_cpu_threads={config.xla_cpu_threads}"] + (
              # MoE routing replay: the workers ask for SGLang's routed experts (`learner.routing_replay`)
              ["--enable-return-routed-experts"] if config.learner.routing_replay else [])


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
  """This process's environment with the repository first on PYTHONPATH: a worker started from any directory
  imports this checkout's `sao` and the config file's `experiments.configs`."""
  out = dict(os.environ if env is None else env)
  out["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, out.get("PYTHONPATH", "")) if p)
  return out


class EmbeddedProcesses:
  """Engines and rollout workers of one run as child processes (see the module docstring).

  Args:
    config: the run's experiment config.
    workdir: the run directory (`logs/` go there; the engines' compilation cache too with
      `compilation_cache_dir=""`).
    config_args: the trainer's own config flags (`--config=<file>:<arg>`, `--config.<key>=<value>`...), which every
      worker is started with, so trainer and workers read one config.
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir: str, config_args: Sequence[str]):
    self.config = config
    self.workdir = workdir
    self.config_args = list(config_args)
    self.log_dir = os.path.join(workdir, "logs")
    os.makedirs(self.log_dir, exist_ok=True)
    self.engines: list[processes.ChildProcess] = []
    self.router: processes.ChildProcess | None = None
    self.dead_engines: set[str] = set()  # names of engines behind the router that died (reported once)
    self.workers: list[processes.ChildProcess] = []
    self.worker_restarts = processes.RestartBudget(MAX_WORKER_RESTARTS)

  def start_engines(self, model_dir: str) -> list[str]:
    """Local engines serving `model_dir` (behind a router when there are several; its URL is returned), or the
    config's external `engine_urls` (then nothing is started)."""
    if self.config.engine_urls:
      return list(self.config.engine_urls)
    from sao.engines import router as router_lib  # pylint: disable=g-import-not-at-top
    from sao.engines.local_server import start_local_engine  # pylint: disable=g-import-not-at-top
    if self.config.num_engines > 1:
      router_lib.require_router()  # before the engines start: ImportError with the install command
    args = engine_args(self.config, compilation_cache.engines_dir(
        compilation_cache.run_dir(self.config.compilation_cache_dir, self.workdir)))
    urls = []
    for i in range(self.config.num_engines):
      env = child_env()
      gpu_share.apply("engine", self.config.num_engines, env, engine_index=i)  # its share of a GPU the trainer uses
      handle, url = start_local_engine(model_dir, log_path=os.path.join(self.log_dir, f"engine{i}.log"),
                                       engine_args=args, name=f"engine {i}", env=env)
      self.engines.append(handle)
      urls.append(url)
    print(f"[embedded] engines: {urls}", flush=True)
    if len(urls) == 1:
      return urls
    self.router = router_lib.start_router(urls, log_path=os.path.join(self.log_dir, "router.log"),
                                          policy=ROUTER_POLICY, env=child_env())
    print(f"[embedded] sglang-router {self.router.url} in front of {len(urls)} engines "
          f"(log {self.router.log_path})", flush=True)
    return [self.router.url]

  def worker(self, index: int, trainer_address: str) -> processes.ChildProcess:
    """Rollout worker `index` (not started)."""
    return processes.ChildProcess(
        f"rollout worker {index}", worker_lib.command(self.config_args, trainer_address, index),
        os.path.join(self.log_dir, f"worker{index}.log"), env=child_env(), restarts=self.worker_restarts)

  def start_workers(self, trainer_address: str) -> None:
    c = self.config
    self.workers = [self.worker(i, trainer_address).start() for i in range(c.num_workers)]
    print(f"[embedded] {c.num_workers} worker(s) × {c.rollout.concurrency} agent loops → {trainer_address}",
          flush=True)

  def check_alive(self) -> None:
    """Raises if the router, a lone engine or every engine behind the router died, or a worker died with no
    restarts left; restarts other dead workers."""
    if self.router is not None:
      self.router.check()  # no restart budget: a dead router is a ChildError naming it, with its log's tail
      for handle in self.engines:
        if not handle.alive() and handle.name not in self.dead_engines:
          self.dead_engines.add(handle.name)
          print(f"[embedded] {handle.name} (pid {handle.pid}) exited with code {handle.returncode}; the run goes "
                f"on with the other engines behind the router. Its log ends:\n{handle.log_tail(1000)}", flush=True)
      if len(self.dead_engines) == len(self.engines):
        raise processes.ChildError(f"every engine behind the router exited ({', '.join(sorted(self.dead_engines))});"
                                   f" their logs are under {self.log_dir}")
    else:
      for handle in self.engines:
        handle.check()  # no restart budget: a dead engine is a ChildError naming it, with its log's tail
    for worker in self.workers:
      restarted = worker.check()
      if restarted:
        print(f"[embedded] {restarted}\n(its leases expire and are re-leased)", flush=True)

  def stop(self) -> None:
    processes.stop_all([*self.workers, *([self.router] if self.router else []), *self.engines])
