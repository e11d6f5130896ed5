"""The local JAX engine: SGLang's HTTP API (`/generate`, `/update_weights_from_disk`, `/health`, `/get_model_info`,
`/flush_cache`) served from `sao.models.sampling.Sampler`, with dynamic batching.

Dynamic batching: requests (or the rows of a batch request) wait in a queue; the batch loop takes the first, then
keeps collecting for `batch_window_ms` or until `max_batch_size` rows, and runs them as ONE `Sampler.generate` call
(prefill and decode together; the Sampler pads to bucketed shapes, so shapes repeat and nothing recompiles per
request). Sampling params are per row (the Sampler takes temperature/top_p/top_k/stop ids per row), so one batch
mixes requests freely. The jitted work runs in a worker thread, so the event loop keeps accepting requests (which
form the next batch) while a batch decodes. `max_batch_size=1` turns batching off.

Weight updates: `/update_weights_from_disk` loads the HF directory in a worker thread while batches keep running,
then takes the batch lock, swaps the params and sets the served `weight_version` in one step. A batch is atomic
with respect to the swap: requests already in a running batch finish on the OLD weights and report the old version
in `meta_info.weight_version`; every later batch uses the new ones. (No request ever mixes two versions.)

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
import logging
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any, Mapping, Sequence

import numpy as np
from aiohttp import web

from sao.engines import lifetime
from sao.models.config import ModelConfig
from sao.models.hf import load_pretrained
from sao.models.sampling import (BATCH_BUCKETS, NEW_TOKEN_BUCKETS, PROMPT_BUCKETS, Completion, Sampler,
                                 SamplingParams)

log = logging.getLogger(__name__)

READY_PREFIX = "SAO_ENGINE_READY url="


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """batch_window_ms: how long the batch loop keeps collecting after the first waiting row; max_batch_size: rows
  per Sampler call (1 = no batching); buckets: the Sampler's shape buckets; seed: base of the per-batch PRNG seed."""
  batch_window_ms: float = 5.0
  max_batch_size: int = 128
  prompt_buckets: tuple[int, ...] = PROMPT_BUCKETS
  batch_buckets: tuple[int, ...] = BATCH_BUCKETS
  new_token_buckets: tuple[int, ...] = NEW_TOKEN_BUCKETS
  max_stop_ids: int = 16
  seed: int = 0
  dtype: str = "float32"

  def __post_init__(self):
    if self.max_batch_size < 1:
      raise ValueError(f"max_batch_size: must be >= 1, got {self.max_batch_size}")
    if self.batch_window_ms < 0:
      raise ValueError(f"batch_window_ms: must be >= 0, got {self.batch_window_ms}")
    if self.max_batch_size > max(self.batch_buckets):
      raise ValueError(f"max_batch_size {self.max_batch_size} exceeds the largest batch bucket {self.batch_buckets}")


class RequestError(ValueError):
  """A malformed request (answered with HTTP 400 and this message)."""


@dataclasses.dataclass
class _Row:
  prompt: np.ndarray  # [P] int32
  params: SamplingParams
  future: asyncio.Future  # → (Completion, weight_version)


def _load_eos_ids(model_path: str) -> tuple[tuple[int, ...], Any]:
  """(eos ids, Tokenizer or None) from the model directory's tokenizer files, if it has them."""
  if not os.path.isfile(os.path.join(model_path, "tokenizer.json")):
    return (), None
  from sao.models.tokenizer import Tokenizer  # jinja2/tokenizers only when there is a tokenizer to load
  tokenizer = Tokenizer.from_pretrained(model_path)
  return tuple(tokenizer.eos_token_ids), tokenizer


class LocalEngine:
  """The batching core behind the HTTP handlers (usable without HTTP: `await engine.generate(...)`)."""

  def __init__(self, model_path: str, config: EngineConfig = EngineConfig(), weight_version: str = "0"):
    self.config = config
    self.model_path = model_path
    self.model_config, params = load_pretrained(model_path, dtype=config.dtype)
    self.eos_ids, self.tokenizer = _load_eos_ids(model_path)
    self.sampler = Sampler(self.model_config, params, prompt_buckets=config.prompt_buckets,
                           batch_buckets=config.batch_buckets, new_token_buckets=config.new_token_buckets,
                           max_stop_ids=config.max_stop_ids)
    self.weight_version = str(weight_version)
    self.stats = {"requests": 0, "rows": 0, "batches": 0, "max_rows_per_batch": 0, "weight_updates": 0,
                  "generated_tokens": 0, "busy_s": 0.0}
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

  def check_row(self, i: int, input_ids: Any, params: Mapping[str, Any]) -> tuple[np.ndarray, SamplingParams]:
    """Validates one prompt + SGLang sampling_params dict; raises `RequestError` naming the field."""
    where = f"input_ids[{i}]" if i >= 0 else "input_ids"
    if not isinstance(input_ids, list) or not input_ids:
      raise RequestError(f"{where}: expected a non-empty list of token ids")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in input_ids):
      raise RequestError(f"{where}: token ids must be integers")
    prompt = np.asarray(input_ids, np.int64)
    vocab = self.model_config.vocab_size
    bad = np.flatnonzero((prompt < 0) | (prompt >= vocab))
    if bad.size:
      raise RequestError(f"{where}: token id {prompt[bad[0]]} at position {bad[0]} is out of range [0, {vocab})")
    if prompt.size >= self.context_length:
      raise RequestError(f"{where}: prompt of {prompt.size} tokens does not fit the context length "
                         f"{self.context_length}")
    if not isinstance(params, Mapping):
      raise RequestError(f"sampling_params: expected an object, got {type(params).__name__}")
    known = {"max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids", "ignore_eos", "skip_special_tokens",
             "stop", "min_p", "n", "no_stop_trim"}
    unknown = sorted(set(params) - known)
    if unknown:
      raise RequestError(f"sampling_params: unsupported keys {unknown}")
    if params.get("stop"):
      raise RequestError("sampling_params.stop: stop strings are not supported by the local engine; "
                         "use stop_token_ids")
    if params.get("n", 1) != 1:
      raise RequestError("sampling_params.n: only n = 1 is supported")
    try:
      max_new = int(params.get("max_new_tokens", 128))
      temperature = float(params.get("temperature", 1.0))
      top_p = float(params.get("top_p", 1.0))
      top_k = int(params.get("top_k", -1))
      stop_ids = [int(t) for t in params.get("stop_token_ids") or []]
    except (TypeError, ValueError) as e:
      raise RequestError(f"sampling_params: {e}") from e
    if max_new < 1:
      raise RequestError(f"sampling_params.max_new_tokens: must be >= 1, got {max_new}")
    if temperature < 0 or not 0 < top_p <= 1:
      raise RequestError(f"sampling_params: need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
    if not params.get("ignore_eos", False):
      stop_ids += [t for t in self.eos_ids if t not in stop_ids]
    if len(stop_ids) > self.config.max_stop_ids:
      raise RequestError(f"sampling_params.stop_token_ids: at most {self.config.max_stop_ids} ids (eos included)")
    max_new = min(max_new, self.context_length - prompt.size, max(self.config.new_token_buckets))
    return prompt.astype(np.int32), SamplingParams(max_new_tokens=max_new, temperature=temperature, top_p=top_p,
                                                   top_k=max(top_k, 0), stop_token_ids=tuple(stop_ids))

  async def generate(self, rows: Sequence[tuple[np.ndarray, SamplingParams]]) -> list[tuple[Completion, str]]:
    """Queues checked rows for the batch loop; returns (completion, weight_version) per row, in order."""
    if self._queue is None:
      raise RuntimeError("LocalEngine.start() was not awaited")
    loop = asyncio.get_running_loop()
    pending = [_Row(p, sp, loop.create_future()) for p, sp in rows]
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
        seed = next(self._seeds) % (2**31)
        start = time.monotonic()
        try:
          completions = await loop.run_in_executor(
              self._executor, self.sampler.generate, [r.prompt for r in batch], [r.params for r in batch], seed)
        except Exception as e:  # a failed batch fails its requests (500), never the loop
          log.exception("engine batch of %d rows failed", len(batch))
          for r in batch:
            if not r.future.done():
              r.future.set_exception(e)
          continue
        self.stats["busy_s"] += time.monotonic() - start
      self.stats["batches"] += 1
      self.stats["rows"] += len(batch)
      self.stats["max_rows_per_batch"] = max(self.stats["max_rows_per_batch"], len(batch))
      for r, c in zip(batch, completions):
        self.stats["generated_tokens"] += len(c.token_ids)
        if not r.future.done():
          r.future.set_result((c, version))

  # ---- weights ------------------------------------------------------------------------------------------------

  async def update_weights(self, model_path: str, weight_version: str | None = None) -> str:
    """Loads `model_path` (off the event loop), then swaps params + version between batches. Returns the version."""
    loop = asyncio.get_running_loop()
    config, params = await loop.run_in_executor(None, lambda: load_pretrained(model_path, dtype=self.config.dtype))
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
    return self.weight_version

  def model_info(self) -> dict[str, Any]:
    stats = dict(self.stats)
    stats["rows_per_batch_mean"] = stats["rows"] / stats["batches"] if stats["batches"] else 0.0
    return {"model_path": self.model_path, "tokenizer_path": self.model_path if self.tokenizer else None,
            "is_generation": True, "weight_version": self.weight_version, "engine": "sao-local-jax",
            "vocab_size": self.model_config.vocab_size, "context_length": self.context_length,
            "max_batch_size": self.config.max_batch_size, "batch_window_ms": self.config.batch_window_ms,
            "stats": stats}


# ---- HTTP -------------------------------------------------------------------------------------------------------

def _error(status: int, message: str) -> web.Response:
  return web.json_response({"error": {"message": message, "code": status}}, status=status)


def _result_json(engine: LocalEngine, completion: Completion, version: str, prompt_tokens: int,
                 params: Mapping[str, Any], latency_s: float) -> dict[str, Any]:
  ids = completion.token_ids.tolist()
  if completion.finish_reason == "stop":
    finish = {"type": "stop", "matched": ids[-1]}
  else:
    finish = {"type": "length", "length": len(ids)}
  text = ""
  if engine.tokenizer is not None:
    text = engine.tokenizer.decode(ids, skip_special_tokens=bool(params.get("skip_special_tokens", True)))
  return {"text": text, "output_ids": ids,
          "meta_info": {"prompt_tokens": prompt_tokens, "completion_tokens": len(ids), "cached_tokens": 0,
                        "finish_reason": finish, "weight_version": version, "e2e_latency": latency_s,
                        "output_token_logprobs": [[float(lp), int(t), None]
                                                  for lp, t in zip(completion.logprobs.tolist(), ids)]}}


async def _read_json(request: web.Request) -> Any:
  try:
    return await request.json()
  except ValueError as e:
    raise RequestError(f"request body is not valid JSON: {e}") from e


def build_app(engine: LocalEngine) -> web.Application:
  """The aiohttp application serving `engine` (starts/stops the batch loop with the app)."""
  app = web.Application(client_max_size=256 * 1024 * 1024)

  async def generate(request: web.Request) -> web.Response:
    start = time.monotonic()
    try:
      body = await _read_json(request)
      if not isinstance(body, Mapping):
        raise RequestError("request body must be a JSON object")
      if "input_ids" not in body:
        raise RequestError("input_ids: required (the local engine takes token ids, not text)")
      if not body.get("return_logprob", True):
        log.debug("return_logprob false: log-probs are returned anyway")
      input_ids = body["input_ids"]
      batched = isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)
      prompts = input_ids if batched else [input_ids]
      sp = body.get("sampling_params") or {}
      if isinstance(sp, list):
        if not batched or len(sp) != len(prompts):
          raise RequestError(f"sampling_params: a list needs one entry per prompt ({len(prompts)})")
        sps = sp
      else:
        sps = [sp] * len(prompts)
      rows = [engine.check_row(i if batched else -1, p, s) for i, (p, s) in enumerate(zip(prompts, sps))]
    except RequestError as e:
      return _error(400, str(e))
    try:
      results = await engine.generate(rows)
    except Exception as e:  # noqa: BLE001 — reported to the client as a 500 with the cause; logged in the loop
      return _error(500, f"generation failed: {type(e).__name__}: {e}")
    latency = time.monotonic() - start
    out = [_result_json(engine, c, v, len(p), s, latency) for (c, v), p, s in zip(results, prompts, sps)]
    return web.json_response(out if batched else out[0])

  async def update_weights(request: web.Request) -> web.Response:
    try:
      body = await _read_json(request)
      if not isinstance(body, Mapping) or not isinstance(body.get("model_path"), str):
        raise RequestError("model_path: required (a HF checkpoint directory)")
      if not os.path.isdir(body["model_path"]):
        raise RequestError(f"model_path {body['model_path']!r}: not a directory")
      version = body.get("weight_version")
      version = await engine.update_weights(body["model_path"], None if version is None else str(version))
    except (RequestError, ValueError, OSError) as e:
      return web.json_response({"success": False, "message": str(e)}, status=400)
    return web.json_response({"success": True, "message": "Succeeded to update model weights.",
                              "num_paused_requests": 0, "weight_version": version})

  async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)

  async def model_info(request: web.Request) -> web.Response:
    return web.json_response(engine.model_info())

  async def flush_cache(request: web.Request) -> web.Response:
    return web.Response(text="Cache flushed (the local engine keeps no prefix cache).\n")

  async def on_startup(app: web.Application) -> None:
    await engine.start()

  async def on_cleanup(app: web.Application) -> None:
    await engine.stop()

  app.router.add_post("/generate", generate)
  app.router.add_post("/update_weights_from_disk", update_weights)
  app.router.add_get("/health", health)
  app.router.add_get("/get_model_info", model_info)
  app.router.add_post("/flush_cache", flush_cache)
  app.on_startup.append(on_startup)
  app.on_cleanup.append(on_cleanup)
  return app


# ---- subprocess launcher ----------------------------------------------------------------------------------------

class LocalEngineProcess:
  """A `python -m sao.engines.serve` subprocess; `stop()` (or the context manager) terminates it."""

  def __init__(self, process: subprocess.Popen, url: str, log_path: str):
    self.process = process
    self.url = url
    self.log_path = log_path

  def log_tail(self, n_chars: int = 4000) -> str:
    try:
      with open(self.log_path, errors="replace") as f:
        return f.read()[-n_chars:]
    except OSError as e:
      return f"(log {self.log_path} unreadable: {e})"

  def alive(self) -> bool:
    return self.process.poll() is None

  def stop(self, timeout_s: float = 10.0) -> None:
    if self.process.poll() is None:
      self.process.terminate()
      try:
        self.process.wait(timeout_s)
      except subprocess.TimeoutExpired:
        self.process.kill()
        self.process.wait(timeout_s)

  def __enter__(self) -> LocalEngineProcess:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.stop()


def start_local_engine(model_path: str, port: int = 0, host: str = "127.0.0.1", *,
                       engine_args: Sequence[str] = (), startup_timeout_s: float = 180.0,
                       env: Mapping[str, str] | None = None,
                       log_path: str | None = None) -> tuple[LocalEngineProcess, str]:
  """Spawns `python -m sao.engines.serve --model_path=... --port=...` and waits for its ready line and `/health`.

  `engine_args` are extra serve flags (`--max_batch_size=1`, `--batch_window_ms=2`, ...). The server's stdout and
  stderr go to `log_path` (a temp file by default; its tail is in any startup error). Returns (process, url).
  """
  if log_path is None:
    fd, log_path = tempfile.mkstemp(prefix="sao-engine-", suffix=".log")
    os.close(fd)
  cmd = [sys.executable, "-m", "sao.engines.serve", f"--model_path={model_path}", f"--port={port}", f"--host={host}",
         *engine_args]
  with open(log_path, "wb") as log_file:
    process = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               env=lifetime.child_env(env))
  handle = LocalEngineProcess(process, "", log_path)
  deadline = time.monotonic() + startup_timeout_s
  try:
    while not handle.url:
      if process.poll() is not None:
        raise RuntimeError(f"engine exited with code {process.returncode} before it was ready; log tail:\n"
                           f"{handle.log_tail()}")
      if time.monotonic() > deadline:
        raise TimeoutError(f"engine not ready within {startup_timeout_s}s; log tail:\n{handle.log_tail()}")
      for line in handle.log_tail(1 << 20).splitlines():
        if line.startswith(READY_PREFIX):
          handle.url = line[len(READY_PREFIX):].strip()
      time.sleep(0.05)
    while True:
      try:
        with urllib.request.urlopen(handle.url + "/health", timeout=5) as resp:
          if resp.status == 200:
            return handle, handle.url
      except OSError as e:
        if time.monotonic() > deadline:
          raise TimeoutError(f"engine {handle.url}/health not answering: {e}; log tail:\n{handle.log_tail()}") from e
      time.sleep(0.05)
  except BaseException:
    handle.stop()
    raise
