"""The local JAX engine's batching core: SGLang-style requests served from `sao.models.sampling.Sampler`, with
dynamic batching (`LocalEngine`; the HTTP app around it is `sao.engines.http_app`, the process launcher
`sao.engines.local_server`).

Dynamic batching: requests (or the rows of a batch request) wait in a queue; the batch loop takes the first, then
keeps collecting for `batch_window_ms` or until `max_batch_size` rows, and runs them as ONE `Sampler.generate` call
(prefill and decode together; the Sampler pads to bucketed shapes, so shapes repeat and nothing recompiles per
request). Sampling params are per row (the Sampler takes temperature/top_p/top_k/stop ids per row), so one batch
mixes requests freely. The jitted work runs in a worker thread, so the event loop keeps accepting requests (which
form the next batch) while a batch decodes. `max_batch_size=1` turns batching off.

Queue bound (`EngineConfig.max_queued_rows`, default 4096): a request whose rows would take the rows waiting for a
batch past the bound is refused with `EngineOverloadedError` (HTTP 503, as SGLang answers when overloaded; nothing
of it was queued), so a flood of clients meets back-pressure instead of a server growing without limit; the
SGLang client (`sao.engines.sglang_client`) backs off and asks again. A request with more rows than the bound could
never fit: `RequestError` (400).

Isolation: every row is validated before it is queued (`sao.engines.request_checks`: 400 naming the field). If a
batch still fails inside the Sampler, its rows are re-run one at a time (`sao.engines.row_isolation`), so only a row
that fails on its own fails (its request gets the error); a row whose log-probs are not finite fails alone the same
way. Batch-mates never see another row's failure.

Weight updates: `update_weights` loads the HF directory in a worker thread while batches keep running, then takes
the batch lock, swaps the params and sets the served `weight_version` in one step. A batch is atomic with respect to
the swap: requests already in a running batch finish on the OLD weights and report the old version; every later
batch uses the new ones. (No request ever mixes two versions.)

Prefix cache (`EngineConfig.prefix_cache_bytes`, on by default; 0 turns it off): the state after every served
prompt + completion is kept (`sao.engines.prefix_cache`, LRU within the byte bound), and a later request whose prompt
extends it (the next turn of the conversation) prefills only the new tokens (`Sampler.generate_continuing`). The
cache is cleared on every weight update and keyed by the served weights, so a new version never reuses old keys and
values. Log-probs equal the uncached ones up to float rounding (a cached token's keys/values come from the step
that computed them, not from a fresh prefill): tests/engines/test_prefix_cache.py bounds the difference.

Routed experts (SGLang's `--enable-return-routed-experts`, `EngineConfig.enable_return_routed_experts`, an MoE model
only): a row that asks (`return_routed_experts`) gets `Completion.routed_experts`, the experts each of its prompt +
completion tokens was routed to, `[P + n, layers, top_k]` (`sao.models.routed_experts`; the HTTP app sends SGLang's
`[P + n − 1, ...]`). The prefix cache keeps each entry's routing when the batch that computed it captured routing
(`sao.engines.routed_prefix`), so such a row continues from a cached conversation like any other; an entry without
a record is not reused for it.

Context length: a prompt must be shorter than the model's `max_position_embeddings` and fit the largest prompt
bucket (else 400); `max_new_tokens` is clamped so prompt + completion fits the context (finish reason `length`).
Stop ids: the request's `stop_token_ids` plus the tokenizer's eos ids (when the model directory has a tokenizer),
unless `ignore_eos` is set, as SGLang does. Greedy is `temperature: 0`.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import os
import time
from typing import Any, Awaitable, Callable, Sequence

import jax
import numpy as np

from sao.engines import routed_prefix
from sao.engines import row_isolation
from sao.engines.prefix_cache import PrefixCache
from sao.engines.routed_prefix import RoutedState
from sao.engines.request_checks import RequestError, RowLimits, check_row
from sao.engines.row_isolation import RowFailedError  # noqa: F401  (re-exported: part of this module's `__all__`)
from sao.models.config import ModelConfig
from sao.models.streaming import load_pretrained_sharded
from sao.models.sampling import (BATCH_BUCKETS, NEW_TOKEN_BUCKETS, PROMPT_BUCKETS, Completion, Sampler,
                                 SamplingParams)

__all__ = ["EngineConfig", "EngineOverloadedError", "LocalEngine", "RequestError", "RowFailedError"]


class EngineOverloadedError(RuntimeError):
  """`max_queued_rows` rows already wait for a batch: the request was not queued (HTTP 503; the client retries)."""


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """batch_window_ms: how long the batch loop keeps collecting after the first waiting row; max_batch_size: rows
  per Sampler call (1 = no batching); max_queued_rows: how many rows may wait for a batch (beyond it a request is
  refused: `EngineOverloadedError`); buckets: the Sampler's shape buckets; seed: base of the per-batch PRNG seed."""
  batch_window_ms: float = 5.0
  max_batch_size: int = 128
  # Generous: 32 full batches of the default size (a toy run's workers keep at most a few hundred rows in flight).
  max_queued_rows: int = 4096
  prompt_buckets: tuple[int, ...] = PROMPT_BUCKETS
  batch_buckets: tuple[int, ...] = BATCH_BUCKETS
  new_token_buckets: tuple[int, ...] = NEW_TOKEN_BUCKETS
  max_stop_ids: int = 16
  seed: int = 0
  dtype: str = "float32"
  # The prefix cache across turns (`sao.engines.prefix_cache`): its bound in bytes (0 turns it off) and the
  # buckets of the prompt part it does not cover (empty: the prompt buckets).
  prefix_cache_bytes: int = 256 * 2**20
  suffix_buckets: tuple[int, ...] = ()
  # SGLang's `--enable-return-routed-experts`: rows may ask for the experts their tokens were routed to.
  enable_return_routed_experts: bool = False

  def __post_init__(self):
    if self.max_batch_size < 1:
      raise ValueError(f"max_batch_size: must be >= 1, got {self.max_batch_size}")
    if self.max_queued_rows < 1:
      raise ValueError(f"max_queued_rows: must be >= 1, got {self.max_queued_rows}")
    if self.batch_window_ms < 0:
      raise ValueError(f"batch_window_ms: must be >= 0, got {self.batch_window_ms}")
    if self.prefix_cache_bytes < 0:
      raise ValueError(f"prefix_cache_bytes: must be >= 0 (0 = off), got {self.prefix_cache_bytes}")
    if self.suffix_buckets and max(self.suffix_buckets) < max(self.prompt_buckets):
      raise ValueError(f"suffix_buckets {self.suffix_buckets}: the largest must cover the largest prompt bucket "
                       f"{max(self.prompt_buckets)} (a request without a cached prefix prefills its whole prompt)")
    if self.max_batch_size > max(self.batch_buckets):
      raise ValueError(f"max_batch_size {self.max_batch_size} exceeds the largest batch bucket {self.batch_buckets}")


@dataclasses.dataclass
class _Row:
  prompt: np.ndarray  # [P] int32
  params: SamplingParams
  future: asyncio.Future  # → (Completion, weight_version)
  routed: bool = False  # return_routed_experts


def _load_eos_ids(model_path: str) -> tuple[tuple[int, ...], Any]:
  """(eos ids, Tokenizer or None) from the model directory's tokenizer files, if it has them."""
  if not os.path.isfile(os.path.join(model_path, "tokenizer.json")):
    return (), None
  from sao.models.tokenizer import Tokenizer  # jinja2/tokenizers only when there is a tokenizer to load
  tokenizer = Tokenizer.from_pretrained(model_path)
  return tuple(tokenizer.eos_token_ids), tokenizer


def non_finite_params(params: Any) -> list[str]:
  """The paths of the parameter arrays holding a NaN or an infinity (empty when every weight is finite)."""
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  finite = jax.device_get([jax.numpy.isfinite(leaf).all() for _, leaf in leaves])
  return [jax.tree_util.keystr(path) for (path, _), ok in zip(leaves, finite) if not bool(ok)]


def _routing_kwargs(capture: bool) -> dict[str, bool]:
  """The Sampler's `return_routed_experts` argument, passed only when set (so a sampler without it serves the rest)."""
  return {"return_routed_experts": True} if capture else {}


class LocalEngine:
  """The batching core behind the HTTP handlers (usable without HTTP: `await engine.generate(...)`)."""

  def __init__(self, model_path: str, config: EngineConfig = EngineConfig(), weight_version: str = "0"):
    self.config = config
    self.model_path = model_path
    # Streamed tensor by tensor onto the default device (the host never holds the whole model).
    self.model_config, params = load_pretrained_sharded(model_path, dtype=config.dtype)
    if config.enable_return_routed_experts and not self.model_config.num_experts:
      raise ValueError(f"enable_return_routed_experts: the model at {model_path!r} has no MoE layers")
    self.eos_ids, self.tokenizer = _load_eos_ids(model_path)
    self.sampler = Sampler(self.model_config, params, prompt_buckets=config.prompt_buckets,
                           batch_buckets=config.batch_buckets, new_token_buckets=config.new_token_buckets,
                           max_stop_ids=config.max_stop_ids, suffix_buckets=config.suffix_buckets or None)
    self.weight_version = str(weight_version)
    self.stats = {"requests": 0, "rows": 0, "batches": 0, "max_rows_per_batch": 0, "weight_updates": 0,
                  "generated_tokens": 0, "busy_s": 0.0, "isolated_batches": 0, "failed_rows": 0,
                  "prompt_tokens": 0, "cached_prompt_tokens": 0, "overloaded_requests": 0,
                  # The last weight update's parts: reading the directory into device arrays (wall and CPU
                  # seconds), then waiting for the running batch and swapping (the publication benchmark's phases).
                  "last_update_load_s": 0.0, "last_update_load_cpu_s": 0.0, "last_update_swap_s": 0.0}
    self.prefix_cache: PrefixCache | None = None
    if config.prefix_cache_bytes:
      truncatable = all(kind == "full_attention" for kind in self.model_config.layer_types)
      self.prefix_cache = PrefixCache(config.prefix_cache_bytes, truncatable, version=self._weights_key())
    self._queue: asyncio.Queue[_Row] | None = None
    self._lock: asyncio.Lock | None = None  # held while a batch runs and while params are swapped
    self._loop_task: asyncio.Task | None = None
    # One worker thread for jitted work: batches run one at a time, in order.
    self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sao-engine")
    self._seeds = itertools.count(config.seed * 1_000_003)

  @property
  def context_length(self) -> int:
    return min(self.model_config.max_position_embeddings, max(self.config.prompt_buckets))

  async def start(self) -> None:
    self._queue = asyncio.Queue()
    self._lock = asyncio.Lock()
    self._loop_task = asyncio.create_task(self._batch_loop(), name="sao-engine-batch-loop")

  async def stop(self) -> None:
    if self._loop_task is not None:
      self._loop_task.cancel()
      try:
        await self._loop_task
      except asyncio.CancelledError:
        pass
    self._executor.shutdown(wait=False, cancel_futures=True)

  # ---- requests -----------------------------------------------------------------------------------------------

  @property
  def limits(self) -> RowLimits:
    """What every request row must fit (see `request_checks.check_row`)."""
    return RowLimits(vocab_size=self.model_config.vocab_size, context_length=self.context_length,
                     max_new_tokens_cap=max(self.config.new_token_buckets), max_stop_ids=self.config.max_stop_ids,
                     eos_ids=self.eos_ids)

  def check_row(self, i: int, input_ids: Any, params: Any) -> tuple[np.ndarray, SamplingParams]:
    """Validates one prompt (row `i` of a batch request, or -1 for a single one) + SGLang sampling_params dict;
    raises `RequestError` naming the field."""
    return check_row(f"input_ids[{i}]" if i >= 0 else "input_ids", input_ids, params, self.limits)

  async def generate(self, rows: Sequence[tuple[np.ndarray, SamplingParams]],
                     routed: Sequence[bool] | None = None) -> list[tuple[Completion, str]]:
    """Queues checked rows for the batch loop; returns (completion, weight_version) per row, in order. `routed[i]`:
    row i returns its routed experts (needs `enable_return_routed_experts`). Raises `RequestError` for more rows
    than `max_queued_rows` or routed experts the server was not started for, and `EngineOverloadedError` (nothing
    queued) when the rows waiting for a batch would exceed the bound."""
    if self._queue is None:
      raise RuntimeError("LocalEngine.start() was not awaited")
    routed = [False] * len(rows) if routed is None else [bool(r) for r in routed]
    if len(routed) != len(rows):
      raise ValueError(f"routed: {len(routed)} flags for {len(rows)} rows")
    if any(routed) and not self.config.enable_return_routed_experts:
      raise RequestError("return_routed_experts: the server was started without --enable-return-routed-experts")
    bound = self.config.max_queued_rows
    if len(rows) > bound:
      raise RequestError(f"input_ids: {len(rows)} prompts, more than the engine queues (max_queued_rows={bound})")
    if self._queue.qsize() + len(rows) > bound:
      self.stats["overloaded_requests"] += 1
      raise EngineOverloadedError(f"engine overloaded: {self._queue.qsize()} rows wait for a batch and this request "
                                  f"adds {len(rows)} (max_queued_rows={bound}); retry later")
    loop = asyncio.get_running_loop()
    pending = [_Row(p, sp, loop.create_future(), r) for (p, sp), r in zip(rows, routed)]
    self.stats["requests"] += 1
    for row in pending:
      self._queue.put_nowait(row)
    return list(await asyncio.gather(*(r.future for r in pending)))

  async def _collect(self) -> list[_Row]:
    """The next batch: the first waiting row, then whatever arrives within the window, up to max_batch_size."""
    batch = [await self._queue.get()]
    deadline = time.monotonic() + self.config.batch_window_ms / 1000.0
    while len(batch) < self.config.max_batch_size:
      if not self._queue.empty():
        batch.append(self._queue.get_nowait())
        continue
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        break
      try:
        batch.append(await asyncio.wait_for(self._queue.get(), remaining))
      except asyncio.TimeoutError:
        break
    return [r for r in batch if not r.future.done()]  # a caller that went away cancelled its future

  async def _batch_loop(self) -> None:
    loop = asyncio.get_running_loop()
    while True:
      batch = await self._collect()
      if not batch:
        continue
      async with self._lock:
        version = self.weight_version
        start = time.monotonic()
        outcomes = await row_isolation.run_isolated(batch, self._sampling(loop, self._weights_key()), self.stats)
        self.stats["busy_s"] += time.monotonic() - start
      self.stats["batches"] += 1
      self.stats["rows"] += len(batch)
      self.stats["max_rows_per_batch"] = max(self.stats["max_rows_per_batch"], len(batch))
      for r, outcome in zip(batch, outcomes):
        if r.future.done():
          continue
        if isinstance(outcome, BaseException):
          self.stats["failed_rows"] += 1
          r.future.set_exception(outcome)
        else:
          self.stats["generated_tokens"] += len(outcome.token_ids)
          r.future.set_result((outcome, version))

  def _sampling(self, loop: asyncio.AbstractEventLoop, weights_key: str
                ) -> Callable[[Sequence[_Row]], Awaitable[list[Completion]]]:
    """`rows` -> one `_sample` call on them in the worker thread, with the next seed (`row_isolation.run_isolated`'s
    `sample`)."""
    return lambda rows: loop.run_in_executor(
        self._executor, self._sample, [r.prompt for r in rows], [r.params for r in rows],
        next(self._seeds) % (2**31), weights_key, [r.routed for r in rows])

  def _weights_key(self) -> str:
    """Names the params being served: the version, and the count of updates (a reused version string differs)."""
    return f"{self.stats['weight_updates']}:{self.weight_version}"

  def _sample(self, prompts: list[np.ndarray], params: list[SamplingParams], seed: int, weights_key: str,
              routed: list[bool]) -> list[Completion]:
    """One Sampler call (in the worker thread). With the prefix cache: each row continues from the longest cached
    state its prompt extends (a row that asks for routed experts: from none), and the state after its prompt +
    completion is cached for the next turn. Routed experts are kept only on the rows that asked."""
    self.stats["prompt_tokens"] += sum(p.size for p in prompts)
    capture = any(routed)
    cache = self.prefix_cache
    if cache is None:
      completions = self.sampler.generate(prompts, params, seed, **_routing_kwargs(capture))
      return [c if r else dataclasses.replace(c, routed_experts=None) for c, r in zip(completions, routed)]
    # A row asking for routed experts reuses only a prefix whose routing was recorded.
    hits = [cache.lookup(p, weights_key, routed_prefix.has_routing if r else None) for p, r in zip(prompts, routed)]
    prefixes = [None if h is None else h.state.truncated(h.length) for h in hits]
    states_in = [None if p is None else p.state for p in prefixes]
    completions, states = self.sampler.generate_continuing(prompts, params, states_in, seed, **_routing_kwargs(capture))
    if capture:  # each row's whole record: the cached prefix's, then what this call fed
      completions = [c if p is None or p.routing is None else dataclasses.replace(
          c, routed_experts=np.concatenate([p.routing, c.routed_experts])) for c, p in zip(completions, prefixes)]
    records = [c.routed_experts for c in completions]
    completions = [c if r else dataclasses.replace(c, routed_experts=None) for c, r in zip(completions, routed)]
    for p, c, state, hit, record in zip(prompts, completions, states, hits, records):
      if row_isolation.bad_completion(c) is None:
        tokens = np.concatenate([p, c.token_ids])
        whole = record is not None and len(record) == tokens.size  # else this prefix's routing is unknown
        cache.insert(tokens, RoutedState(state, record if whole else None), weights_key,
                     None if hit is None else hit.entry_id)
    self.stats["cached_prompt_tokens"] += sum(c.cached_tokens for c in completions)
    return completions

  # ---- weights ------------------------------------------------------------------------------------------------

  def _load(self, model_path: str) -> tuple[ModelConfig, Any, float]:
    """The directory's config and params, every transfer finished (a swap never waits on a half-copied array), and
    the CPU seconds of this thread spent on it."""
    start = time.thread_time()
    config, params = load_pretrained_sharded(model_path, dtype=self.config.dtype)
    return config, jax.block_until_ready(params), time.thread_time() - start

  async def update_weights(self, model_path: str, weight_version: str | None = None) -> str:
    """Loads `model_path` (off the event loop), then swaps params + version between batches. Returns the version."""
    loop = asyncio.get_running_loop()
    start = time.monotonic()
    config, params, load_cpu_s = await loop.run_in_executor(None, lambda: self._load(model_path))
    loaded = time.monotonic()
    bad = await loop.run_in_executor(None, lambda: non_finite_params(params))
    if bad:  # refused before the swap: the served weights stay
      raise RequestError(f"model_path {model_path!r}: non-finite weights in {', '.join(bad[:4])}"
                         f"{f' and {len(bad) - 4} more' if len(bad) > 4 else ''}")
    if config != self.model_config:
      diff = {f.name: (getattr(self.model_config, f.name), getattr(config, f.name))
              for f in dataclasses.fields(ModelConfig) if getattr(self.model_config, f.name) != getattr(config, f.name)}
      raise RequestError(f"model_path {model_path!r}: its config differs from the served model's: {diff}")
    async with self._lock:  # waits for the running batch: its requests finish on the old weights
      self.sampler.update_params(params)
      if weight_version is None:
        weight_version = str(int(self.weight_version) + 1) if self.weight_version.isdigit() else self.weight_version
      self.weight_version = str(weight_version)
      self.model_path = model_path
      self.stats["weight_updates"] += 1
      if self.prefix_cache is not None:  # keys/values of the old weights must never serve the new ones
        self.prefix_cache.clear(self._weights_key())
      self.stats["last_update_load_s"] = loaded - start
      self.stats["last_update_load_cpu_s"] = load_cpu_s
      self.stats["last_update_swap_s"] = time.monotonic() - loaded
    return self.weight_version

  async def flush_cache(self) -> int:
    """Drops every prefix-cache entry (SGLang's `/flush_cache`) between batches; returns how many were dropped (0
    without a cache). Later requests prefill from scratch until the cache fills again; the weights are unchanged."""
    if self.prefix_cache is None:
      return 0
    async with self._lock:  # not under a running batch, which may still insert what it computed
      dropped = len(self.prefix_cache)
      self.prefix_cache.clear(self._weights_key())
    return dropped

  def model_info(self) -> dict[str, Any]:
    stats = dict(self.stats)
    stats["rows_per_batch_mean"] = stats["rows"] / stats["batches"] if stats["batches"] else 0.0
    if self.prefix_cache is not None:
      stats["prefix_cache"] = {**self.prefix_cache.stats, "entries": len(self.prefix_cache),
                               "bytes": self.prefix_cache.nbytes, "max_bytes": self.prefix_cache.max_bytes}
    # tokenizer_path: always a string, as SGLang reports it (its default, the model path, even with
    # --skip-tokenizer-init); SGLang's GetModelInfoResponse type has no null there.
    return {"model_path": self.model_path, "tokenizer_path": self.model_path,
            "is_generation": True, "weight_version": self.weight_version, "engine": "sao-local-jax",
            "vocab_size": self.model_config.vocab_size, "context_length": self.context_length,
            "max_batch_size": self.config.max_batch_size, "batch_window_ms": self.config.batch_window_ms,
            "stats": stats}


