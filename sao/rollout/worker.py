r"""Rollout worker: leases tasks from the trainer, runs agent loops against the engines, submits trajectories.

    python -m sao.rollout.worker --trainer=127.0.0.1:50051 --tokenizer_path=<HF dir> [--concurrency=64]

Many episodes run concurrently in one asyncio loop; the blocking gRPC client runs in threads. Each leased task is
played `len(sample_indices)` times (SAO: once; GSPO: G times, or only the missing samples of a re-leased group), with
the lease's temperature. Leases of running episodes are heartbeated; an episode whose lease expired is abandoned
(the trainer has re-leased its task). Finished trajectories are submitted in small batches; the client keeps and
re-sends anything unacknowledged, so a trainer restart loses nothing. The worker exits when the trainer reports no
more work for `idle_exit_s`, or on SIGTERM/SIGINT.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import signal
import time
from typing import Sequence

import grpc
from absl import app, flags

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

  def __post_init__(self):
    if self.concurrency < 1:
      raise ValueError(f"concurrency: must be >= 1, got {self.concurrency}")
    if self.submit_batch < 1:
      raise ValueError(f"submit_batch: must be >= 1, got {self.submit_batch}")
    self.harness_mixture = harness_lib.HarnessMixture(tuple(self.harnesses), tuple(self.harness_weights),
                                                      self.eval_harness, self.harness_seed)


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
      self._engines[url] = SGLangEngine(url, timeout_s=self.config.episode_timeout_s)
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

  async def _heartbeat_loop(self) -> None:
    # Runs until `run()` cancels it after the submitter is done: while stopping, samples still waiting for their
    # acknowledgement keep their leases too.
    while True:
      # A third of the lease TTL at most: a live episode's lease must never lapse between two heartbeats.
      # Until the first lease tells the TTL, poll briefly (no RPC is made while nothing runs).
      interval = min(self.config.heartbeat_interval_s, self._lease_ttl_s / 3) if self._lease_ttl_s else 0.5
      if self._stop.is_set():
        await asyncio.sleep(interval)
      else:
        try:
          await asyncio.wait_for(self._stop.wait(), timeout=interval)
        except TimeoutError:
          pass
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


_TRAINER = flags.DEFINE_string("trainer", "127.0.0.1:50051", "The trainer's gRPC address.")
_TOKENIZER = flags.DEFINE_string("tokenizer_path", "", "HF directory with tokenizer.json; empty = the toy tokenizer.")
_ENGINES = flags.DEFINE_list("engine_urls", [], "Engine URLs (overrides what the trainer hands out).")
_CONCURRENCY = flags.DEFINE_integer("concurrency", 64, "Concurrent agent loops.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens per model turn.")
_MAX_TURNS = flags.DEFINE_integer("max_turns", 32, "Model turns per episode (the env may stop earlier).")
_MAX_TOKENS = flags.DEFINE_integer("max_total_tokens", 4096, "Tokens per episode.")
_IDLE_EXIT = flags.DEFINE_float("idle_exit_s", 0.0, "Exit after this long without work (0 = never).")
_HARNESSES = flags.DEFINE_list("harnesses", ["xml_json"], "Harnesses training episodes are sampled from.")
_HARNESS_WEIGHTS = flags.DEFINE_list("harness_weights", [], "Their relative weights (empty = equal).")
_EVAL_HARNESS = flags.DEFINE_string("eval_harness", "", "The harness validation runs through ('' = the first).")
_HARNESS_SEED = flags.DEFINE_integer("harness_seed", 0, "Seeds the per-episode harness choice.")
_ENV_KWARGS = flags.DEFINE_string("env_kwargs", "", 'Environment constructor kwargs per env name, as JSON: '
                                   '{"swe": {"command_timeout_s": 10}}.')
_TOKEN_ENV = flags.DEFINE_string("token_env", "SAO_TRAINER_TOKEN", "Environment variable holding the shared secret.")


def _harness_weights(values: Sequence[str]) -> tuple[float, ...]:
  try:
    return tuple(float(v) for v in values)
  except ValueError as e:
    raise app.UsageError(f"--harness_weights: not numbers: {list(values)}") from e


def _env_kwargs(text: str) -> dict | None:
  if not text:
    return None
  try:
    value = json.loads(text)
  except json.JSONDecodeError as e:
    raise app.UsageError(f"--env_kwargs: not JSON ({e.msg} at char {e.pos}): {text!r}") from e
  if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
    raise app.UsageError(f"--env_kwargs: expected {{env name: {{kwarg: value}}}}, got {text!r}")
  return value


def main(argv: list[str]) -> None:
  del argv
  import os  # pylint: disable=g-import-not-at-top
  logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s")
  lifetime.exit_with_parent()  # started by a launcher: end with it
  config = WorkerConfig(trainer_address=_TRAINER.value, tokenizer_path=_TOKENIZER.value,
                        engine_urls=tuple(_ENGINES.value), token=os.environ.get(_TOKEN_ENV.value) or None,
                        concurrency=_CONCURRENCY.value, max_new_tokens=_MAX_NEW.value, max_turns=_MAX_TURNS.value,
                        max_total_tokens=_MAX_TOKENS.value, idle_exit_s=_IDLE_EXIT.value,
                        harnesses=tuple(_HARNESSES.value), harness_weights=_harness_weights(_HARNESS_WEIGHTS.value),
                        eval_harness=_EVAL_HARNESS.value, harness_seed=_HARNESS_SEED.value,
                        env_kwargs=_env_kwargs(_ENV_KWARGS.value))
  worker = RolloutWorker(config)

  async def run():
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
      loop.add_signal_handler(sig, worker.stop)
    return await worker.run()

  stats = asyncio.run(run())
  log.info("worker done: %s", stats)


if __name__ == "__main__":
  app.run(main)
