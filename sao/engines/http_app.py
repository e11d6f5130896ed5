"""SGLang's HTTP API over a `LocalEngine`: `/generate`, `/update_weights_from_disk`, `/health`, `/get_model_info`,
`/flush_cache` (run as a server with `python -m sao.engines.serve`).

Status codes: 400 for a request the engine refuses (the message names the field; nothing was queued), 401 without
the server's token (when it has one; `/health` is exempt, see `sao.engines.auth`), 503 (with `Retry-After`) when
the engine's queue is full (`EngineConfig.max_queued_rows`; nothing was queued, ask again later), 500 only for a
request whose own row failed inside the sampler (its batch-mates are served). Every body is valid JSON (no NaN).
"""
from __future__ import annotations

import functools
import json
import logging
import os
import time
from typing import Any, Mapping

from aiohttp import web

from sao.engines import auth
from sao.engines.local_engine import EngineOverloadedError, LocalEngine
from sao.engines.request_checks import RequestError, check_generate_body, routed_experts_flags
from sao.models import routed_experts
from sao.models.sampling import Completion

log = logging.getLogger(__name__)

# Refuses NaN/Infinity (which json.dumps would write, producing a body no strict JSON parser accepts).
_dumps = functools.partial(json.dumps, allow_nan=False)


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
  return web.json_response({"error": {"message": message, "code": status}}, status=status, headers=headers)


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
  meta = {"prompt_tokens": prompt_tokens, "completion_tokens": len(ids), "cached_tokens": completion.cached_tokens,
          "finish_reason": finish, "weight_version": version, "e2e_latency": latency_s,
          "output_token_logprobs": [[float(lp), int(t), None] for lp, t in zip(completion.logprobs.tolist(), ids)]}
  if completion.routed_experts is not None:  # SGLang's: base64 of int32 [prompt + completion − 1, layers, top_k]
    meta["routed_experts"] = routed_experts.encode(completion.routed_experts[:-1])  # the last token is not sent
  return {"text": text, "output_ids": ids, "meta_info": meta}


async def _read_json(request: web.Request) -> Any:
  """The body as JSON; `RequestError` (a 400) for anything else, nesting too deep for the parser included."""
  try:
    return await request.json()
  except ValueError as e:
    raise RequestError(f"request body is not valid JSON: {e}") from e
  except RecursionError:
    raise RequestError("request body is not valid JSON: nested too deeply") from None


def build_app(engine: LocalEngine, api_key: str | None = None) -> web.Application:
  """The aiohttp application serving `engine` (starts/stops the batch loop with the app). With `api_key`, every
  endpoint but `/health` requires `Authorization: Bearer <api_key>`."""
  middlewares = [auth.bearer_middleware(api_key, _error, exempt_paths=("/health",))] if api_key else []
  app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=middlewares)

  async def generate(request: web.Request) -> web.Response:
    start = time.monotonic()
    try:
      body = await _read_json(request)
      batched, rows, sps = check_generate_body(body, engine.limits)
      routed = routed_experts_flags(body, len(rows))
    except RequestError as e:
      return _error(400, str(e))
    try:
      results = await engine.generate(rows, routed)
    except RequestError as e:
      return _error(400, str(e))
    except EngineOverloadedError as e:
      return _error(503, str(e), headers={"Retry-After": "1"})
    except Exception as e:  # noqa: BLE001 — this request's own row failed (logged in the batch loop)
      return _error(500, f"generation failed: {type(e).__name__}: {e}")
    latency = time.monotonic() - start
    out = [_result_json(engine, c, v, len(p), s, latency) for (c, v), (p, _), s in zip(results, rows, sps)]
    try:
      return web.json_response(out if batched else out[0], dumps=_dumps)
    except ValueError as e:  # a non-finite number slipped through: say so rather than send invalid JSON
      log.error("generate: response not JSON-serialisable: %s", e)
      return _error(500, f"generation failed: response is not valid JSON ({e})")

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
    dropped = await engine.flush_cache()
    return web.Response(text=f"Cache flushed ({dropped} prefix-cache entries dropped).\n")

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
