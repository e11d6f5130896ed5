"""Async HTTP client for SGLang's native API (one server or an `sglang-router`), also spoken by the local JAX engine.

Endpoints (SGLang's request/response shapes; the recorded bodies in `tests/engines/fixtures/` are what the parsers
are tested against, and `tests/engines/test_sglang_contract.py` checks every request against SGLang 0.5.23's own
definitions, docs/fleet.md "The SGLang contract"):
  POST /generate                  {"input_ids": [int] | [[int]], "sampling_params": {...} | [{...}],
                                   "return_logprob": true}
                                  → {"text", "output_ids", "meta_info": {"output_token_logprobs":
                                     [[logprob, token_id, text_or_null], ...], "finish_reason": {"type": "stop" |
                                     "length" | "abort", "matched"?/"length"?/"message"?}, "prompt_tokens",
                                     "completion_tokens", "weight_version"?, "routed_experts"?, ...}}
                                  (a list of those for a batch). With `"return_routed_experts": true` (the client's
                                  `return_routed_experts`; a server started with --enable-return-routed-experts),
                                  meta_info.routed_experts is base64 of int32 [prompt + completion − 1, layers,
                                  top_k] (`sao.models.routed_experts`), decoded to one row of layers·top_k ids per
                                  token
  POST /update_weights_from_disk  {"model_path", "weight_version"?, "flush_cache"?} → {"success", "message", ...}
  GET  /health                    200 when the server can serve
  GET  /get_model_info            {"model_path", "weight_version"?, ...}
  POST /flush_cache

Failure policy: a connection error or a 5xx other than 503 is retried `max_retries` times with exponential backoff
(`backoff_s`, doubling, capped at `max_backoff_s`), then raises `EngineUnavailableError`. A 503 means the server is
overloaded (SGLang's answer when its queue is full; the local engine's when `max_queued_rows` rows wait): it is
retried with the same backoff but does not use up `max_retries` -- the client backs off for as long as the request's
`timeout_s` allows, then raises `EngineOverloadedError` (an `EngineTimeoutError`: the engine gave no answer in time,
so an agent loop ends the episode as a timeout, not as an engine failure). When the 503 carries `Retry-After`
(seconds or an HTTP date; the local engine sends `Retry-After: 1`), the client waits max(own backoff, Retry-After),
the server's part capped at `max_backoff_s` and at what is left of the request's timeout. A 4xx raises `EngineError`
at once with the endpoint, status and the server's message; a request that exceeds `timeout_s` raises
`EngineTimeoutError` (not retried: the server may still be working on it, and the caller owns the deadline).

Auth: with `api_key` (default: `$SAO_ENGINE_API_KEY`, see `sao.engines.auth`) every request carries
`Authorization: Bearer <api_key>`, which a server started with a token requires (SGLang's `--api-key` too).
"""
from __future__ import annotations

import asyncio
import dataclasses
import datetime
import email.utils
import json
import logging
import math
import time
from typing import Any, Mapping, Sequence

import aiohttp

from sao.engines import auth
from sao.models import routed_experts as routing
from sao.models.sampling import SamplingParams

log = logging.getLogger(__name__)

FINISH_REASONS = ("stop", "length", "abort")


class EngineError(RuntimeError):
  """A request the engine refused or could not serve. `status` is the HTTP status (None: no response)."""

  def __init__(self, endpoint: str, message: str, status: int | None = None):
    self.endpoint = endpoint
    self.status = status
    self.message = message
    where = f"{endpoint} (HTTP {status})" if status is not None else endpoint
    super().__init__(f"engine {where}: {message}")


class EngineUnavailableError(EngineError):
  """The engine could not be reached (connection refused/reset, or 5xx) after every retry."""


class EngineTimeoutError(EngineError):
  """The engine did not answer within the client's timeout."""


class EngineOverloadedError(EngineTimeoutError):
  """The engine answered 503 (overloaded) to every attempt until the request's timeout ran out."""


@dataclasses.dataclass(frozen=True)
class GenerateResult:
  """One completion. token_ids: [n] sampled ids (a matched stop token included, as SGLang returns it);
  logprobs: [n] the engine's log-prob of each (None entries are not allowed); finish_reason: stop | length | abort.
  weight_version: the weights that sampled it, as the server reports it (None if it does not). routed_experts: when
  asked for, int32 [prompt_tokens + n − 1, layers·top_k], the experts each fed token was routed to (SGLang's rows,
  each token's [layers, top_k] flattened)."""
  token_ids: tuple[int, ...]
  logprobs: tuple[float, ...]
  finish_reason: str
  weight_version: str | None = None
  prompt_tokens: int = 0
  text: str | None = None
  finish_detail: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  routed_experts: Any = None  # np.ndarray [prompt_tokens + n − 1, layers·top_k] int32, or None


def sampling_params_to_json(params: SamplingParams | Mapping[str, Any]) -> dict[str, Any]:
  """SGLang's `sampling_params` dict. A `SamplingParams` maps field by field; top_k = 0 (off) becomes SGLang's -1."""
  if isinstance(params, SamplingParams):
    return {"max_new_tokens": params.max_new_tokens, "temperature": params.temperature, "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1, "stop_token_ids": list(params.stop_token_ids)}
  return dict(params)


def _fail(endpoint: str, detail: str) -> EngineError:
  return EngineError(endpoint, f"malformed response: {detail}")


def parse_generate_item(item: Any, endpoint: str = "/generate", routed_experts: bool = False) -> GenerateResult:
  """One `/generate` result object → `GenerateResult`; raises `EngineError` naming the field that is wrong.
  `routed_experts`: the request asked for them, so meta_info.routed_experts must be there."""
  if not isinstance(item, Mapping):
    raise _fail(endpoint, f"expected an object, got {type(item).__name__}")
  meta = item.get("meta_info")
  if not isinstance(meta, Mapping):
    raise _fail(endpoint, "missing 'meta_info' object")
  entries = meta.get("output_token_logprobs")
  if not isinstance(entries, list):
    raise _fail(endpoint, "missing meta_info.output_token_logprobs (was return_logprob set?)")
  token_ids, logprobs = [], []
  for i, entry in enumerate(entries):
    if not isinstance(entry, (list, tuple)) or len(entry) < 2:
      raise _fail(endpoint, f"output_token_logprobs[{i}]: expected [logprob, token_id, text], got {entry!r}")
    lp, tid = entry[0], entry[1]
    if not isinstance(tid, int) or isinstance(tid, bool):
      raise _fail(endpoint, f"output_token_logprobs[{i}]: token id {tid!r} is not an integer")
    if not isinstance(lp, (int, float)) or isinstance(lp, bool) or not math.isfinite(lp):
      raise _fail(endpoint, f"output_token_logprobs[{i}]: log-prob {lp!r} is not a finite number")
    token_ids.append(tid)
    logprobs.append(float(lp))
  output_ids = item.get("output_ids")
  if isinstance(output_ids, list) and output_ids and list(output_ids) != token_ids:
    raise _fail(endpoint, "output_ids disagree with the ids in output_token_logprobs")
  finish = meta.get("finish_reason")
  if isinstance(finish, str):  # some SGLang versions/routers flatten it
    finish = {"type": finish}
  if not isinstance(finish, Mapping) or finish.get("type") not in FINISH_REASONS:
    raise _fail(endpoint, f"meta_info.finish_reason {finish!r}: expected {{'type': one of {FINISH_REASONS}}}")
  version = meta.get("weight_version")
  prompt_tokens = int(meta.get("prompt_tokens", 0) or 0)
  routed = None
  if routed_experts:
    if "routed_experts" not in meta:
      raise _fail(endpoint, "missing meta_info.routed_experts (was the server started with "
                  "--enable-return-routed-experts?)")
    try:
      routed = routing.decode_rows(meta["routed_experts"], prompt_tokens + len(token_ids) - 1)
    except ValueError as e:
      raise _fail(endpoint, f"meta_info.{e} (prompt_tokens {prompt_tokens}, {len(token_ids)} output tokens)") from e
  return GenerateResult(token_ids=tuple(token_ids), logprobs=tuple(logprobs), finish_reason=finish["type"],
                        weight_version=None if version is None else str(version), prompt_tokens=prompt_tokens,
                        text=item.get("text"), finish_detail=dict(finish), routed_experts=routed)


def parse_generate_response(body: Any, endpoint: str = "/generate",
                            routed_experts: bool = False) -> GenerateResult | list[GenerateResult]:
  """A `/generate` body: one object (single request) or a list of them (batch request)."""
  if isinstance(body, list):
    return [parse_generate_item(x, endpoint, routed_experts) for x in body]
  return parse_generate_item(body, endpoint, routed_experts)


def error_message(body: Any, text: str) -> str:
  """The server's error message from an error body (SGLang: {"error": {"message"}}, {"message"} or plain text)."""
  if isinstance(body, Mapping):
    err = body.get("error")
    if isinstance(err, Mapping) and "message" in err:
      return str(err["message"])
    if isinstance(err, str):
      return err
    if "message" in body:
      return str(body["message"])
    if "detail" in body:
      return str(body["detail"])
  return text.strip()[:2000] or "(empty body)"


def retry_after_seconds(value: str | None, now: datetime.datetime | None = None) -> float | None:
  """Seconds a `Retry-After` header asks the client to wait: delta-seconds ("1", also "0.5") or an HTTP date (a date
  in the past means 0). None when the header is absent; a value that is neither is logged and ignored (None)."""
  if value is None:
    return None
  text = value.strip()
  try:
    seconds = float(text)
  except ValueError:
    seconds = None
  if seconds is not None:
    if math.isfinite(seconds) and seconds >= 0:
      return seconds
    log.warning("ignoring Retry-After %r: not a non-negative number of seconds", value)
    return None
  try:
    when = email.utils.parsedate_to_datetime(text)
  except (TypeError, ValueError):
    log.warning("ignoring Retry-After %r: neither seconds nor an HTTP date", value)
    return None
  if when.tzinfo is None:  # RFC 9110 dates are GMT; parsedate gives a naive datetime for "-0000"
    when = when.replace(tzinfo=datetime.timezone.utc)
  now = now or datetime.datetime.now(datetime.timezone.utc)
  return max(0.0, (when - now).total_seconds())


class SGLangEngine:
  """Client for one SGLang-compatible server. Use as `async with SGLangEngine(url) as engine: ...` or call
  `close()`; the aiohttp session is created lazily in the running event loop. `api_key`: the server's token
  (None: `$SAO_ENGINE_API_KEY` if set, else no Authorization header). `return_routed_experts`: every generate
  request asks for the routed experts (SGLang's request field) and each result carries them (MoE routing replay)."""

  def __init__(self, base_url: str, timeout_s: float = 300.0, max_retries: int = 3, backoff_s: float = 0.2,
               max_backoff_s: float = 5.0, connection_limit: int = 512, api_key: str | None = None,
               return_routed_experts: bool = False):
    if max_retries < 0:
      raise ValueError(f"max_retries: must be >= 0, got {max_retries}")
    if timeout_s <= 0:
      raise ValueError(f"timeout_s: must be > 0, got {timeout_s}")
    self.base_url = base_url.rstrip("/")
    self.timeout_s = float(timeout_s)
    self.max_retries = int(max_retries)
    self.backoff_s = float(backoff_s)
    self.max_backoff_s = float(max_backoff_s)
    self.connection_limit = int(connection_limit)
    self.return_routed_experts = bool(return_routed_experts)
    api_key = auth.token_from_env(api_key)
    self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    self._session: aiohttp.ClientSession | None = None

  async def __aenter__(self) -> SGLangEngine:
    return self

  async def __aexit__(self, *exc: Any) -> None:
    await self.close()

  async def close(self) -> None:
    if self._session is not None and not self._session.closed:
      await self._session.close()
    self._session = None

  def _get_session(self) -> aiohttp.ClientSession:
    if self._session is None or self._session.closed:
      self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self.connection_limit),
                                            headers=self._headers)
    return self._session

  async def request(self, method: str, endpoint: str, payload: Any = None, timeout_s: float | None = None,
                    expect_json: bool = True) -> Any:
    """One request with the retry policy of the module docstring; returns the decoded JSON body (None if empty), or
    the text when `expect_json` is False (SGLang answers /flush_cache in plain text)."""
    url = self.base_url + endpoint
    timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
    give_up_overloaded = time.monotonic() + timeout.total  # 503s are retried until then
    delay = self.backoff_s
    last: str = ""
    failures = 0  # connection errors and 5xx but 503: the retries `max_retries` allows
    while True:
      overloaded = False
      server_wait: float | None = None  # the 503's Retry-After, in seconds
      try:
        async with self._get_session().request(method, url, json=payload, timeout=timeout) as resp:
          text = await resp.text()
          try:
            body = json.loads(text) if text.strip() else None
          except json.JSONDecodeError:
            body = None
          if resp.status >= 500:
            last = f"HTTP {resp.status}: {error_message(body, text)}"
            overloaded = resp.status == 503
            if overloaded:
              server_wait = retry_after_seconds(resp.headers.get("Retry-After"))
          elif resp.status >= 400:
            raise EngineError(endpoint, error_message(body, text), resp.status)
          elif not expect_json:
            return text
          elif text.strip() and body is None:
            raise EngineError(endpoint, f"response is not JSON: {text[:200]!r}", resp.status)
          else:
            return body
      except asyncio.TimeoutError as e:
        raise EngineTimeoutError(endpoint, f"no answer from {url} within {timeout.total:.1f}s") from e
      except aiohttp.ClientConnectionError as e:  # refused, reset, server disconnected
        last = f"{type(e).__name__}: {e}"
      # Retry: an overloaded server (503) for as long as the request's timeout allows, any other failure
      # `max_retries` times.
      wait = delay
      if overloaded:
        remaining = give_up_overloaded - time.monotonic()
        if delay > remaining:
          raise EngineOverloadedError(endpoint, f"{url} stayed overloaded for {timeout.total:.1f}s; last answer: "
                                      f"{last}", 503)
        if server_wait is not None:  # the server knows its queue better than our doubling does
          wait = max(delay, min(server_wait, self.max_backoff_s, remaining))
        log.info("engine %s: overloaded (%s); retrying in %.2fs", url, last, wait)
      else:
        failures += 1
        if failures > self.max_retries:
          raise EngineUnavailableError(endpoint, f"{url} failed after {self.max_retries + 1} attempts; last error: "
                                       f"{last}")
        log.warning("engine %s: attempt %d/%d failed (%s); retrying in %.2fs", url, failures, self.max_retries + 1,
                    last, delay)
      await asyncio.sleep(wait)
      delay = min(delay * 2, self.max_backoff_s)

  def _routing_field(self) -> dict[str, Any]:
    return {"return_routed_experts": True} if self.return_routed_experts else {}

  # ---- endpoints ----------------------------------------------------------------------------------------------

  async def generate(self, input_ids: Sequence[int], sampling_params: SamplingParams | Mapping[str, Any],
                     timeout_s: float | None = None, **extra: Any) -> GenerateResult:
    """Samples one completion of `input_ids` with `return_logprob: true`. `extra` fields go into the request."""
    payload = {"input_ids": [int(i) for i in input_ids], "sampling_params": sampling_params_to_json(sampling_params),
               "return_logprob": True, **self._routing_field(), **extra}
    result = parse_generate_response(await self.request("POST", "/generate", payload, timeout_s), "/generate",
                                     bool(payload.get("return_routed_experts")))
    if isinstance(result, list):
      raise _fail("/generate", "a list came back for a single request")
    return result

  async def generate_batch(self, input_ids: Sequence[Sequence[int]],
                           sampling_params: SamplingParams | Mapping[str, Any] | Sequence[SamplingParams | Mapping],
                           timeout_s: float | None = None, **extra: Any) -> list[GenerateResult]:
    """SGLang's batch form: a list of prompts (one sampling_params for all, or one per prompt) → a list of results."""
    if isinstance(sampling_params, (SamplingParams, Mapping)):
      sp: Any = sampling_params_to_json(sampling_params)
    else:
      sp = [sampling_params_to_json(p) for p in sampling_params]
      if len(sp) != len(input_ids):
        raise ValueError(f"sampling_params: {len(sp)} entries for {len(input_ids)} prompts")
    payload = {"input_ids": [[int(i) for i in p] for p in input_ids], "sampling_params": sp,
               "return_logprob": True, **self._routing_field(), **extra}
    result = parse_generate_response(await self.request("POST", "/generate", payload, timeout_s), "/generate",
                                     bool(payload.get("return_routed_experts")))
    if not isinstance(result, list) or len(result) != len(input_ids):
      raise _fail("/generate", f"expected a list of {len(input_ids)} results")
    return result

  async def update_weights_from_disk(self, model_path: str, weight_version: str | int | None = None,
                                     flush_cache: bool = True, timeout_s: float | None = None) -> dict[str, Any]:
    """Tells the engine to load the HF checkpoint at `model_path` (a path on the engine's machine)."""
    payload: dict[str, Any] = {"model_path": model_path, "flush_cache": bool(flush_cache)}
    if weight_version is not None:
      payload["weight_version"] = str(weight_version)
    body = await self.request("POST", "/update_weights_from_disk", payload, timeout_s)
    if not isinstance(body, Mapping) or not body.get("success", False):
      raise EngineError("/update_weights_from_disk", f"update failed: {error_message(body, str(body))}")
    return dict(body)

  async def health(self, timeout_s: float | None = None) -> bool:
    """True iff GET /health answers 200 (no retries: a health probe should report what it sees)."""
    try:
      async with self._get_session().get(self.base_url + "/health",
                                         timeout=aiohttp.ClientTimeout(total=timeout_s or 5.0)) as resp:
        await resp.read()
        return resp.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
      log.info("engine %s/health: %s", self.base_url, e)
      return False

  async def get_model_info(self, timeout_s: float | None = None) -> dict[str, Any]:
    body = await self.request("GET", "/get_model_info", None, timeout_s)
    if not isinstance(body, Mapping):
      raise _fail("/get_model_info", f"expected an object, got {body!r}")
    return dict(body)

  async def flush_cache(self, timeout_s: float | None = None) -> None:
    await self.request("POST", "/flush_cache", None, timeout_s, expect_json=False)
