r"""Rollout worker: leases tasks from the trainer, runs agent loops against the engines, submits trajectories.

    python -m sao.rollout.worker --config=experiments/configs/sao_openswe.py:toy [--config.<key>=<value> ...] \
        --trainer=127.0.0.1:50051 [--worker_index=0]

It reads the same experiment config as the trainer (`worker_config`: episode limits, harnesses, environment kwargs,
tokenizer, engines); only the trainer's address and the worker's index are its own flags.

Many episodes run concurrently in one asyncio loop; the blocking gRPC client runs in threads. Each leased task is
played `len(sample_indices)` times (SAO: once; GSPO: G times, or only the missing samples of a re-leased group), with
the lease's temperature. Leases of running episodes are heartbeated at a fixed rate (every
`min(heartbeat_interval_s, lease TTL / 3)`, however long the RPC takes: `next_heartbeat`); an episode whose lease
expired is abandoned (the trainer has re-leased its task). Finished trajectories are submitted in small batches; the
client keeps and re-sends anything unacknowledged, so a trainer restart loses nothing. The worker exits when the
trainer reports no more work for `idle_exit_s`, or on SIGTERM/SIGINT.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import math
import os
import signal
import sys
import time
from typing import Sequence

import grpc
import ml_collections
from absl import app, flags
from ml_collections import config_flags

from sao import run_config

from sao.engines import lifetime
from sao.engines.sglang_client import SGLangEngine
from sao.models.sampling import SamplingParams
from sao.models.tokenizer import Tokenizer, toy_tokenizer
from sao.rollout import agent, envs
from sao.rollout import harnesses as harness_lib
from sao.transport.client import TrajectoryClient
from sao.transport.trajectory import Trajectory

log = logging.getLogger(__name__)


@dataclasses.dataclass
class WorkerConfig:
  trainer_address: str
  tokenizer_path: str = ""  # an HF directory with tokenizer.json; "" = the built-in toy tokenizer
  engine_urls: Sequence[str] = ()  # overrides the URLs the trainer hands out
  token: str | None = None
  concurrency: int = 64
  max_new_tokens: int = 64
  top_p: float = 1.0
  top_k: int = 0
  max_turns: int = 32
  max_total_tokens: int = 4096
  episode_timeout_s: float = 600.0
  submit_batch: int = 8
  submit_interval_s: float = 0.2
  submit_budget_s: float = 2.0  # one submit call's retry time for pushed-back trajectories (they stay pending)
  heartbeat_interval_s: float = 10.0
  idle_exit_s: float = 0.0  # 0 = never exit for lack of work
  worker_id: str | None = None
  env_kwargs: dict | None = None  # extra constructor kwargs per env name: {"number_search": {"n": 64}}
  # The harness mixture (`sao.rollout.harnesses`): each training episode's harness is picked at these weights,
  # deterministically from (harness_seed, lease group, sample index); validation runs through `eval_harness`.
  harnesses: Sequence[str] = ("xml_json",)
  harness_weights: Sequence[float] = ()  # empty = equal weights
  eval_harness: str = ""  # "" = harnesses[0]
  harness_seed: int = 0
  # MoE routing replay (`learner.routing_replay`): ask the engines for routed experts; trajectories carry them.
  return_routed_experts: bool = False

  def __post_init__(self):
    if self.concurrency < 1:
      raise ValueError(f"concurrency: must be >= 1, got {self.concurrency}")
    if self.submit_batch < 1:
      raise ValueError(f"submit_batch: must be >= 1, got {self.submit_batch}")
    self.harness_mixture = harness_lib.HarnessMixture(tuple(self.harnesses), tuple(self.harness_weights),
                                                      self.eval_harness, self.harness_seed)


def next_heartbeat(previous: float, period: float, now: float) -> float:
  """The heartbeat after the one due at `previous`: fixed rate, `previous + period`; if that is already past at `now`
  (the last RPC took longer than a period), the first tick of that grid still ahead -- missed ticks are skipped,
  not sent in a burst."""
  deadline = previous + period
  if deadline < now:
    deadline += period * (math.floor((now - deadline) / period) + 1)
  return deadline


class RolloutWorker:
  """One process's worth of concurrent agent loops. `run()` until `stop()` or idle exit."""

  def __init__(self, config: WorkerConfig, tokenizer: Tokenizer | None = None):
    self.config = config
    self.tokenizer = tokenizer or (Tokenizer.from_pretrained(config.tokenizer_path) if config.tokenizer_path
                                   else toy_tokenizer())
    self.client = TrajectoryClient(config.trainer_address, token=config.token, worker_id=config.worker_id)
    self.limits = agent.EpisodeLimits(max_turns=config.max_turns, max_total_tokens=config.max_total_tokens,
                                      timeout_s=config.episode_timeout_s)
    self._engines: dict[str, SGLangEngine] = {}
    self._next_engine = 0
    # lease id -> its samples still running or finished but not yet acknowledged by the trainer: heartbeats keep
    # these leases alive, so a trajectory pushed back (BACKPRESSURE) is not rejected later as UNKNOWN_LEASE.
    self._running: dict[str, int] = {}
    self._active_episodes = 0
    self._done: asyncio.Queue[Trajectory] = asyncio.Queue()
    self._stop = asyncio.Event()
    self.stats = {"episodes": 0, "submitted": 0, "accepted": 0, "rejected": 0, "abandoned": 0}
    self._lease_ttl_s = 0.0  # the TTL of the leases the trainer hands out (0 until the first lease)
    self._clock = time.monotonic  # the heartbeat schedule's clock (a test drives a fake one)

  def stop(self) -> None:
    """Finishes running episodes and submits what the trainer still takes; RPCs no longer retry (a worker stopped
    because its trainer is gone would otherwise wait out every call's retry budget)."""
    self._stop.set()
    self.client.cancel()

  def _engine(self, urls: Sequence[str]) -> SGLangEngine:
    urls = list(self.config.engine_urls) or list(urls)
    if not urls:
      raise RuntimeError("no engine URL: the trainer handed out none and --engine_urls is empty")
    url = urls[self._next_engine % len(urls)]
    self._next_engine += 1
    if url not in self._engines:
      self._engines[url] = SGLangEngine(url, timeout_s=self.config.episode_timeout_s,
                                        return_routed_experts=self.config.return_routed_experts)
    return self._engines[url]

  async def _episode(self, leased, sample_index: int, engine: SGLangEngine) -> None:
    env_kwargs = (self.config.env_kwargs or {}).get(leased.env_name, {})
    queued = False
    env = None
    try:
      env = envs.make(leased.env_name, **env_kwargs)
      task = json.loads(leased.task_json)
      task.setdefault("task_id", leased.task_id)
      sampling = SamplingParams(max_new_tokens=self.config.max_new_tokens, temperature=leased.temperature,
                                top_p=self.config.top_p, top_k=self.config.top_k,
                                stop_token_ids=tuple(self.tokenizer.eos_token_ids))
      harness = harness_lib.get(self.config.harness_mixture.pick(leased.group_id, sample_index,
                                                                 leased.is_validation))
      traj = await harness.run_episode(engine, self.tokenizer, env, task, sampling, self.limits,
                                       sample_index=sample_index, group_id=leased.group_id,
                                       lease_id=leased.lease_id)
      traj.task_id = leased.task_id
      await self._done.put(traj)
      queued = True
      self.stats["episodes"] += 1
    finally:
      self._active_episodes -= 1
      if not queued:
        self._release(leased.lease_id)
      if env is not None and hasattr(env, "close"):  # sandboxed environments free their episode directory
        await asyncio.to_thread(env.close)

  def _release(self, lease_id: str) -> None:
    """One sample of `lease_id` needs no more heartbeats (its episode failed, or the trainer acknowledged it)."""
    left = self._running.get(lease_id, 0) - 1
    if left > 0:
      self._running[lease_id] = left
    else:
      self._running.pop(lease_id, None)

  async def _submit(self, trajs: list[Trajectory]) -> None:
    # A short budget: pushed-back trajectories stay pending in the client and go out again on the next call, so
    # acknowledgements already received are acted on (slots freed, leases released) without waiting on the rest.
    outcomes = await asyncio.to_thread(self.client.submit, trajs, self.config.submit_budget_s)
    for outcome in outcomes + self.client.late_outcomes():
      if outcome.pending:
        continue
      self._release(outcome.lease_id)
      self.stats["submitted"] += 1
      if outcome.accepted:
        self.stats["accepted"] += 1
      else:
        self.stats["rejected"] += 1
        log.warning("trajectory (lease %s, sample %d) rejected: %s %s", outcome.lease_id, outcome.sample_index,
                    outcome.reason, outcome.message)

  async def _submit_loop(self) -> None:
    while not (self._stop.is_set() and self._done.empty() and not self._active_episodes):
      batch = []
      try:
        batch.append(await asyncio.wait_for(self._done.get(), timeout=self.config.submit_interval_s))
      except TimeoutError:
        pass
      while not self._done.empty() and len(batch) < self.config.submit_batch:
        batch.append(self._done.get_nowait())
      if batch or self.client.num_pending:
        await self._submit(batch)

  def _heartbeat_period(self) -> float:
    # A third of the lease TTL at most: a live episode's lease must never lapse between two heartbeats.
    # Until the first lease tells the TTL, poll briefly (no RPC is made while nothing runs).
    return min(self.config.heartbeat_interval_s, self._lease_ttl_s / 3) if self._lease_ttl_s else 0.5

  async def _wait_until(self, deadline: float) -> None:
    """Sleeps until `deadline` (on `self._clock`), or until `stop()` while still running."""
    remaining = max(deadline - self._clock(), 0.0)
    if self._stop.is_set():
      await asyncio.sleep(remaining)
    else:
      try:
        await asyncio.wait_for(self._stop.wait(), timeout=remaining)
      except TimeoutError:
        pass

  async def _heartbeat_loop(self) -> None:
    # Runs until `run()` cancels it after the submitter is done: while stopping, samples still waiting for their
    # acknowledgement keep their leases too. Fixed rate (`next_heartbeat`): the RPC's own time does not stretch the
    # gap between two heartbeats.
    deadline = self._clock()
    while True:
      deadline = next_heartbeat(deadline, self._heartbeat_period(), self._clock())
      await self._wait_until(deadline)
      if self._running:
        try:
          response = await asyncio.to_thread(self.client.heartbeat, list(self._running))
        except grpc.RpcError as e:
          if self._stop.is_set():
            log.info("stopping; heartbeat ended with %s", e.code().name)
            return
          raise
        if response.expired_lease_ids:
          log.warning("leases expired while running: %s", list(response.expired_lease_ids))

  async def run(self) -> dict[str, int]:
    # Env calls run in the default executor (`asyncio.to_thread`); its stock size (cpu + 4 threads) would let a
    # few slow env calls (sandboxes, test suites) stall every other episode, so give each agent loop a thread.
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(max_workers=self.config.concurrency + 4,
                                              thread_name_prefix="sao-worker"))
    submitter = asyncio.create_task(self._submit_loop())
    heartbeat = asyncio.create_task(self._heartbeat_loop())
    episodes: set[asyncio.Task] = set()
    idle_since = time.monotonic()
    try:
      while not self._stop.is_set():
        if heartbeat.done():  # it only ends on its own by failing: without heartbeats every lease would lapse
          heartbeat.result()
          raise RuntimeError("the heartbeat loop ended while the worker was running")
        # A finished sample holds its slot until the trainer acknowledges it: when the trainer pushes back
        # (BACKPRESSURE), the worker stops leasing instead of running ahead with ever more outstanding leases.
        free = self.config.concurrency - max(len(episodes), sum(self._running.values()))
        if free <= 0:
          if episodes:
            await asyncio.wait(episodes, timeout=self.config.submit_interval_s, return_when=asyncio.FIRST_COMPLETED)
          else:
            await asyncio.sleep(self.config.submit_interval_s)  # waiting for acknowledgements
          episodes = {t for t in episodes if not t.done()}
          continue
        try:
          response = await asyncio.to_thread(self.client.lease, free)
        except grpc.RpcError as e:
          if self._stop.is_set():  # cancelled while stopping: nothing more to lease
            log.info("stopping; lease call ended with %s", e.code().name)
            break
          raise
        if not response.tasks:
          if self.config.idle_exit_s and not episodes and time.monotonic() - idle_since > self.config.idle_exit_s:
            log.info("no work for %.0fs; exiting", self.config.idle_exit_s)
            break
          try:
            await asyncio.wait_for(self._stop.wait(), timeout=max(response.retry_after_ms, 50) / 1000)
          except TimeoutError:
            pass
          episodes = {t for t in episodes if not t.done()}
          continue
        idle_since = time.monotonic()
        self._lease_ttl_s = min(t.lease_ttl_ms for t in response.tasks) / 1000
        for leased in response.tasks:
          indices = list(leased.sample_indices) or list(range(leased.num_samples))
          self._running[leased.lease_id] = self._running.get(leased.lease_id, 0) + len(indices)
          for sample_index in indices:
            engine = self._engine(response.engine_urls)
            self._active_episodes += 1  # here, not in the task: the submit loop must see it before the task starts
            episodes.add(asyncio.create_task(self._episode(leased, sample_index, engine)))
        episodes = {t for t in episodes if not t.done()}
      if episodes:
        await asyncio.gather(*episodes)
    finally:
      self._stop.set()
      await submitter
      heartbeat.cancel()
      for engine in self._engines.values():
        await engine.close()
      self.client.close()
    return self.stats


def worker_config(config: ml_collections.ConfigDict, trainer_address: str, worker_index: int | None = None,
                  idle_exit_s: float = 0.0) -> WorkerConfig:
  """A rollout worker's settings from the run's experiment config (`experiments/configs/`), the one home of every
  setting the trainer and its workers share: episode limits (`rollout.*`), the harness mixture, the environment's
  constructor kwargs, the tokenizer (`sao.run_config.tokenizer_path`), external engines (`engine_urls`) and the
  shared secret's environment variable (`server.token_env`)."""
  r = config.rollout
  env_kwargs = config.env.kwargs.to_dict() if hasattr(config.env.kwargs, "to_dict") else dict(config.env.kwargs)
  return WorkerConfig(
      trainer_address=trainer_address, tokenizer_path=run_config.tokenizer_path(config),
      engine_urls=tuple(config.engine_urls), token=os.environ.get(config.server.token_env) or None,
      concurrency=r.concurrency, max_new_tokens=r.max_new_tokens, max_turns=r.max_turns,
      max_total_tokens=r.max_total_tokens, idle_exit_s=idle_exit_s,
      worker_id=None if worker_index is None else f"{config.name}-worker{worker_index}-{os.getpid()}",
      env_kwargs={config.env.name: env_kwargs} if env_kwargs else None,
      # No names: the chat template's own format, `xml_json` (as the demonstrations and evaluation use).
      harnesses=tuple(r.harnesses) or ("xml_json",), harness_weights=tuple(float(w) for w in r.harness_weights),
      eval_harness=r.eval_harness, harness_seed=config.seed,
      return_routed_experts=bool(config.learner.routing_replay))


def command(config_args: Sequence[str], trainer_address: str, worker_index: int | None = None,
            python: str = sys.executable) -> list[str]:
  """The command line of a rollout worker process: `config_args` are the trainer's own `--config=<file>:<arg>`
  and `--config.<key>=<value>` flags (`sao.run_config`'s readers see the same config on both sides)."""
  index = [] if worker_index is None else [f"--worker_index={worker_index}"]
  return [python, "-m", "sao.rollout.worker", *config_args, f"--trainer={trainer_address}", *index]


async def serve(config: WorkerConfig) -> dict[str, int]:
  """Runs a worker until the trainer has no more work (`idle_exit_s`) or SIGTERM/SIGINT; returns its stats."""
  worker = RolloutWorker(config)
  loop = asyncio.get_running_loop()
  for sig in (signal.SIGTERM, signal.SIGINT):
    loop.add_signal_handler(sig, worker.stop)
  return await worker.run()


def define_flags() -> None:
  """The worker program's flags (defined only when it runs as a program, so importing this module defines none)."""
  config_flags.DEFINE_config_file("config", None, "The run's experiment config, `<file>:<arg>` (the trainer's), plus "
                                  "--config.<key>=<value> overrides.", lock_config=True)
  flags.DEFINE_string("trainer", None, "The trainer's gRPC address, host:port.")
  flags.DEFINE_integer("worker_index", None, "This worker's index among the run's workers (names it in the trainer's "
                       "lease records; default: a random id).")
  flags.DEFINE_float("idle_exit_s", 0.0, "Exit after this long without work (0 = never).")
  flags.mark_flags_as_required(["config", "trainer"])


def main(argv: list[str]) -> None:
  del argv
  f = flags.FLAGS
  logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s")
  lifetime.exit_with_parent()  # started by a launcher: end with it
  stats = asyncio.run(serve(worker_config(f.config, f.trainer, f.worker_index, f.idle_exit_s)))
  log.info("worker done: %s", stats)


if __name__ == "__main__":
  define_flags()
  app.run(main)
