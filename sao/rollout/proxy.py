"""Token-capturing proxy: an OpenAI-compatible chat endpoint per session that records what the policy sampled.

How external coding-agent scaffolds are trained without re-tokenising their transcripts. The scaffold is pointed at
`http://127.0.0.1:PORT/sessions/<id>/v1` as its OpenAI base URL; for every `POST .../chat/completions` the proxy

1. decides whether the request EXTENDS the session's recorded conversation: its `messages` start with exactly the
   messages of the previous request plus the assistant message the proxy returned (compared by role, text and
   parsed tool calls, so the OpenAI client's echo format is fine), with the same `tools`. If so, only the new
   messages are rendered (`Tokenizer.render_message_ids`, after the template tokens that close the previous
   assistant turn) and appended with mask 0. If not (the scaffold summarised, truncated or edited history), the
   proxy starts a NEW SEGMENT from the full chat-template rendering and records why in the segment's metadata;
   earlier tokens are never re-tokenised or rewritten;
2. calls the engine with `input_ids` (`return_logprob`), appends the sampled ids verbatim with mask 1 and their
   log-probs;
3. answers in OpenAI format: a `<tool_call>` in the sampled text becomes `tool_calls` (`finish_reason`
   `tool_calls`), otherwise `stop`, or `length` when max_tokens cut the turn.

`trajectories(session_id)` (HTTP: `GET /sessions/<id>/trajectory`) returns one `Trajectory` per segment.
Sessions are independent; requests within one session are serialised.

Bad input and load: a malformed request (`sao.rollout.proxy_checks`), a prompt longer than `context_length`, or a
request the engine refuses as invalid (HTTP 4xx) is answered 400 in OpenAI's error shape and leaves the session as it
was (nothing recorded; the segment is not marked `env_error`). Only an engine failure (5xx, no answer, an unusable
result) answers 502 and marks the segment `env_error`. Live sessions are bounded: at most `max_sessions`, a session
idle for `session_idle_s` is dropped, and when full the least recently used idle session is evicted (503 if every
session is mid-request).

Auth: `serve()` binds loopback by default; a non-loopback host needs `api_key`, which every request must then send as
`Authorization: Bearer <api_key>` (the OpenAI client sends its `api_key` that way), see `sao.engines.auth`.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
import time
import uuid
from typing import Any, Callable, Mapping, Sequence

from aiohttp import web

from sao.engines import auth
from sao.engines.sglang_client import EngineError
from sao.models.tokenizer import ChatTemplateError, Tokenizer
from sao.rollout import tool_format
from sao.rollout.agent import Engine, TokenStream, message_boundaries, parse_weight_version
from sao.rollout.proxy_checks import ChatRequest, ProxyRequestError, check_chat_request, openai_error
from sao.transport.trajectory import Status, Trajectory

log = logging.getLogger(__name__)

# Engine answers that mean "this request is invalid" (the client's fault, e.g. a prompt beyond the context).
_CLIENT_ERROR_STATUSES = (400, 413, 422)


def _text(content: Any) -> str:
  if content is None:
    return ""
  if isinstance(content, str):
    return content
  if isinstance(content, list):  # OpenAI content parts
    return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
  raise ProxyRequestError(f"message content must be a string or a list of parts, got {type(content).__name__}")


def _calls(message: Mapping[str, Any]) -> tuple:
  out = []
  for call in message.get("tool_calls") or []:
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    if isinstance(args, str):
      try:
        args = json.loads(args)
      except json.JSONDecodeError:
        pass  # compared as the raw string
    out.append((fn.get("name"), json.dumps(args, sort_keys=True)))
  return tuple(out)


def normalize_message(message: Mapping[str, Any]) -> tuple:
  """What decides whether two messages are the same turn: role, text, tool calls (ids and extra fields ignored)."""
  if not isinstance(message, Mapping) or "role" not in message:
    raise ProxyRequestError(f"each message needs a role, got {message!r}")
  return (message["role"], _text(message.get("content")), _calls(message))


@dataclasses.dataclass
class Segment(TokenStream):
  """One contiguous token stream of a session (a new one starts when the scaffold rewrites history)."""
  versions: list[int] = dataclasses.field(default_factory=list)
  messages: list[dict] = dataclasses.field(default_factory=list)  # as the template renders them
  seen: list[tuple] = dataclasses.field(default_factory=list)  # normalized, for the extension check
  tools: Any = None
  pending_close: list[int] = dataclasses.field(default_factory=list)  # closes the last assistant turn
  num_turns: int = 0
  status: Status = Status.OK
  metadata: dict[str, str] = dataclasses.field(default_factory=dict)
  generate_s: float = 0.0
  routed_experts: Any = None  # the last model turn's record (MoE routing replay; `sao.rollout.agent`'s rule)

  def checkpoint(self) -> tuple:
    """What `rollback` needs to undo a request that failed (messages, seen and pending_close are replaced by a
    request, never mutated; the token lists only grow)."""
    return (len(self.token_ids), len(self.boundaries), len(self.versions), self.messages, self.seen,
            self.pending_close, self.num_turns, self.status, self.routed_experts)

  def rollback(self, checkpoint: tuple) -> None:
    (n_tokens, n_boundaries, n_versions, self.messages, self.seen, self.pending_close, self.num_turns,
     self.status, self.routed_experts) = checkpoint
    del self.token_ids[n_tokens:], self.action_mask[n_tokens:], self.logprobs[n_tokens:]
    del self.boundaries[n_boundaries:], self.versions[n_versions:]


@dataclasses.dataclass
class Session:
  segments: list[Segment] = dataclasses.field(default_factory=list)
  lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
  last_used: float = 0.0


def _is_client_error(e: EngineError) -> bool:
  return e.status in _CLIENT_ERROR_STATUSES


def _engine_refusal(e: EngineError) -> ProxyRequestError:
  """The engine's 4xx for a request built from the client's input, as the client's 400."""
  too_long = "context length" in e.message
  return ProxyRequestError(f"the engine refused the request: {e.message}", "messages" if too_long else None,
                           "context_length_exceeded" if too_long else "invalid_value")


def _divergence(seen: Sequence[tuple], new: Sequence[tuple]) -> int:
  return next((i for i, (a, b) in enumerate(zip(seen, new)) if a != b), min(len(seen), len(new)))


class TokenCapturingProxy:
  """The proxy's state and handlers. `app()` gives the aiohttp application; `trajectories()` the records."""

  def __init__(self, engine: Engine, tokenizer: Tokenizer, default_max_tokens: int = 1024, harness: str = "proxy", *,
               context_length: int | None = None, max_sessions: int = 1024, session_idle_s: float | None = 3600.0,
               api_key: str | None = None, clock: Callable[[], float] = time.monotonic):
    """context_length: prompts of this many tokens or more are refused (400) before the engine is asked (None: the
    engine decides); max_sessions / session_idle_s: the bound on live sessions (None: no idle timeout);
    api_key: the token every request must carry (None: none; then `serve` binds loopback only)."""
    if max_sessions < 1:
      raise ValueError(f"max_sessions: must be >= 1, got {max_sessions}")
    if session_idle_s is not None and session_idle_s <= 0:
      raise ValueError(f"session_idle_s: must be > 0 or None, got {session_idle_s}")
    self.engine = engine
    self.tokenizer = tokenizer
    self.default_max_tokens = default_max_tokens
    self.harness = harness
    self.context_length = context_length
    self.max_sessions = max_sessions
    self.session_idle_s = session_idle_s
    self.api_key = api_key
    self._clock = clock
    self.sessions: collections.OrderedDict[str, Session] = collections.OrderedDict()  # least recently used first
    self.evicted_sessions = 0
    self._stop_ids = tuple(tokenizer.eos_token_ids)
    if not self._stop_ids:
      raise ValueError("the tokenizer has no eos token to end assistant turns")
    self._end_ids = tokenizer.assistant_end_ids()
    self._gen_prompt_len = len(tokenizer.generation_prompt_ids())

  # ---- one chat completion --------------------------------------------------------------------------------------

  def _session(self, session_id: str) -> Session:
    """The live session `session_id` (created if new, after evicting idle or least recently used ones)."""
    now = self._clock()
    session = self.sessions.get(session_id)
    if session is None:
      self._evict(now)
      session = self.sessions[session_id] = Session()
    self.sessions.move_to_end(session_id)
    session.last_used = now
    return session

  def _evict(self, now: float) -> None:
    """Drops sessions idle past `session_idle_s`, then least recently used ones until a new one fits. A session
    with a request in flight is never dropped; if all are busy, the new session is refused (503)."""
    for sid, s in list(self.sessions.items()):
      idle = self.session_idle_s is not None and now - s.last_used > self.session_idle_s
      if (idle or len(self.sessions) >= self.max_sessions) and not s.lock.locked():
        del self.sessions[sid]
        self.evicted_sessions += 1
        log.info("proxy: evicted session %s (%s)", sid, "idle" if idle else "least recently used")
    if len(self.sessions) >= self.max_sessions:
      raise ProxyRequestError(f"too many live sessions ({self.max_sessions}), all with a request in flight",
                              code="too_many_sessions", status=503)

  def _extend_or_start(self, session: Session, messages: list[dict], tools: Any) -> Segment:
    """Appends the new messages' template tokens to the current segment, or starts a new segment."""
    seen = [normalize_message(m) for m in messages]
    seg = session.segments[-1] if session.segments else None
    if seg is not None and tools == seg.tools and len(seen) > len(seg.seen) and seen[:len(seg.seen)] == seg.seen:
      new = messages[len(seg.messages):]
      ids = self.tokenizer.render_message_ids(new, history=seg.messages, tools=tools, add_generation_prompt=True)
      seg.append(seg.pending_close)
      seg.mark(len(seg.token_ids))
      seg.append(ids)
      seg.messages, seg.seen, seg.pending_close = list(messages), seen, []
      return seg
    fresh = Segment(tools=tools, messages=list(messages), seen=seen)
    if seg is not None:
      why = ("tools changed" if tools != seg.tools else
             f"history rewritten: message {_divergence(seg.seen, seen)} differs from the recorded conversation")
      fresh.metadata["segment_reason"] = why
      log.info("new segment %d: %s", len(session.segments), why)
    prompt = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
    fresh.append(prompt)
    for b in message_boundaries(self.tokenizer, messages, tools, prompt):
      fresh.mark(b)
    session.segments.append(fresh)
    return fresh

  async def chat_completion(self, session_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """Serves one OpenAI chat-completions request for `session_id`; returns the OpenAI response object.

    Raises `ProxyRequestError` (the request is invalid: nothing recorded) or `EngineError` (the engine failed:
    the segment is marked `env_error`)."""
    request = check_chat_request(body, self.default_max_tokens, self._stop_ids)
    session = self._session(session_id)
    async with session.lock:
      n_segments = len(session.segments)
      checkpoint = session.segments[-1].checkpoint() if session.segments else None
      try:
        result, message, finish = await self._turn(session, request)
      except BaseException as e:
        # An invalid request (or a failure we cannot blame on the engine) leaves the session as it was.
        if not isinstance(e, EngineError) or _is_client_error(e):
          del session.segments[n_segments:]
          if checkpoint is not None:
            session.segments[-1].rollback(checkpoint)
        if isinstance(e, EngineError) and _is_client_error(e):
          raise _engine_refusal(e) from e
        raise
    prompt_tokens = int(result.prompt_tokens or 0)
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": request.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(result.token_ids),
                      "total_tokens": prompt_tokens + len(result.token_ids)}}

  async def _turn(self, session: Session, request: ChatRequest) -> tuple[Any, dict[str, Any], str]:
    """Records the request's new messages, samples the reply, records it; returns (result, message, finish)."""
    try:
      seg = self._extend_or_start(session, request.messages, request.tools)
    except (ChatTemplateError, TypeError) as e:
      raise ProxyRequestError(f"chat template: {e}", "messages") from e
    if self.context_length is not None and len(seg.token_ids) >= self.context_length:
      raise ProxyRequestError(f"the conversation is {len(seg.token_ids)} tokens, which does not fit the context "
                              f"length {self.context_length}", "messages", "context_length_exceeded")
    seg.mark(len(seg.token_ids) - self._gen_prompt_len)
    start = time.monotonic()
    try:
      result = await self.engine.generate(seg.token_ids, request.sampling)
    except EngineError as e:
      if not _is_client_error(e):
        seg.status = Status.ENV_ERROR
      raise
    finally:
      seg.generate_s += time.monotonic() - start
    ids = list(result.token_ids)
    if not ids or len(result.logprobs) != len(ids):
      seg.status = Status.ENV_ERROR
      raise EngineError("/generate", f"unusable result (finish {result.finish_reason}, {len(ids)} tokens)")
    if result.routed_experts is not None:  # covers the stream up to this turn's last token
      if len(result.routed_experts) != len(seg.token_ids) + len(ids) - 1:
        seg.status = Status.ENV_ERROR
        raise EngineError("/generate", f"routed_experts: {len(result.routed_experts)} rows for a stream of "
                          f"{len(seg.token_ids) + len(ids) - 1} fed tokens")
      seg.routed_experts = result.routed_experts
    seg.append(ids, result.logprobs)
    seg.num_turns += 1
    version = parse_weight_version(result.weight_version)
    seg.versions.append(0 if version is None else version)
    ended_on_stop = result.finish_reason == "stop" and ids[-1] in self._stop_ids
    seg.pending_close = ([] if ended_on_stop else [self._stop_ids[0]]) + list(self._end_ids)
    text = self.tokenizer.decode(ids[:-1] if ended_on_stop else ids)
    message, finish = self._response_message(text, request.tools, ended_on_stop)
    seg.messages = seg.messages + [message]
    seg.seen = seg.seen + [normalize_message(message)]
    return result, message, finish

  @staticmethod
  def _response_message(text: str, tools: Any, ended_on_stop: bool) -> tuple[dict[str, Any], str]:
    call = tool_format.parse_tool_call(text, tools) if tools else None
    if isinstance(call, tool_format.ToolCall):
      before = text.split(tool_format.OPEN_TAG, 1)[0].strip()
      tool_call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                   "function": {"name": call.name, "arguments": json.dumps(dict(call.arguments))}}
      return {"role": "assistant", "content": before or None, "tool_calls": [tool_call]}, "tool_calls"
    return {"role": "assistant", "content": text}, "stop" if ended_on_stop else "length"

  # ---- records --------------------------------------------------------------------------------------------------

  def trajectories(self, session_id: str, reward: float = 0.0, task_id: str | None = None) -> list[Trajectory]:
    """One trajectory per segment of the session (KeyError if unknown); the last model turn's closing template
    tokens are not included (the scaffold never sent the request that would add them)."""
    session = self.sessions[session_id]
    out = []
    for i, seg in enumerate(session.segments):
      metadata = {**seg.metadata, "session_id": session_id, "segment": str(i),
                  "num_segments": str(len(session.segments))}
      out.append(Trajectory(
          task_id=task_id or session_id, token_ids=seg.token_ids, action_mask=seg.action_mask,
          rollout_logprobs=seg.logprobs, reward=reward, policy_version=min(seg.versions, default=0),
          turn_boundaries=tuple(b for b in seg.boundaries if b < len(seg.token_ids)), num_turns=seg.num_turns,
          status=seg.status, harness=self.harness, timings={"generate_s": seg.generate_s},
          metrics={"num_action_tokens": float(sum(seg.action_mask))}, metadata=metadata,
          routed_experts=seg.routed_experts))
    return out

  def pop_session(self, session_id: str) -> Session | None:
    return self.sessions.pop(session_id, None)

  # ---- HTTP -----------------------------------------------------------------------------------------------------

  def app(self) -> web.Application:
    """The aiohttp application (with `api_key`, every request must carry it as a bearer token)."""
    middlewares = []
    if self.api_key:
      middlewares.append(auth.bearer_middleware(
          self.api_key, lambda status, message: openai_error(status, message, "invalid_request_error",
                                                             code="invalid_api_key")))
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=middlewares)

    async def chat(request: web.Request) -> web.Response:
      sid = request.match_info["session_id"]
      try:
        body = await request.json()
      except (ValueError, RecursionError) as e:  # RecursionError: nested deeper than the parser goes
        why = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        return openai_error(400, f"request body is not valid JSON: {why}", "invalid_request_error",
                            code="invalid_json")
      try:
        return web.json_response(await self.chat_completion(sid, body))
      except ProxyRequestError as e:
        kind = "invalid_request_error" if e.status < 500 else "server_error"
        return openai_error(e.status, str(e), kind, e.param, e.code)
      except EngineError as e:
        log.warning("session %s: engine failed: %s", sid, e)
        return openai_error(502, str(e), "server_error", code="engine_error")
      except Exception as e:  # noqa: BLE001 — a proxy bug: answer in OpenAI's shape, keep serving, log it
        log.exception("session %s: proxy failed", sid)
        return openai_error(500, f"proxy error: {type(e).__name__}: {e}", "server_error", code="internal_error")

    async def trajectory(request: web.Request) -> web.Response:
      sid = request.match_info["session_id"]
      if sid not in self.sessions:
        return openai_error(404, f"unknown session {sid!r}", "invalid_request_error", "session_id", "not_found")
      return web.json_response({"session_id": sid,
                                "segments": [trajectory_to_json(t) for t in self.trajectories(sid)]})

    app.router.add_post("/sessions/{session_id}/v1/chat/completions", chat)
    app.router.add_get("/sessions/{session_id}/trajectory", trajectory)
    return app

  async def serve(self, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, str]:
    """Serves `app()` on host:port (0: a free port); returns (runner, base URL). A non-loopback host needs
    `api_key`. Stop it with `await runner.cleanup()`."""
    auth.require_token_for_bind(host, self.api_key, "TokenCapturingProxy")
    runner = web.AppRunner(self.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    bound_host, bound_port = runner.addresses[0][:2]
    return runner, f"http://{bound_host}:{bound_port}"


def trajectory_to_json(t: Trajectory) -> dict[str, Any]:
  """A JSON-friendly dict of a trajectory (arrays as lists)."""
  return {"task_id": t.task_id, "token_ids": t.token_ids.tolist(), "action_mask": t.action_mask.astype(int).tolist(),
          "rollout_logprobs": t.rollout_logprobs.tolist(), "reward": t.reward, "policy_version": t.policy_version,
          "turn_boundaries": list(t.turn_boundaries), "num_turns": t.num_turns, "status": str(t.status),
          "harness": t.harness, "timings": t.timings, "metrics": t.metrics, "metadata": t.metadata}


def trajectory_from_json(d: Mapping[str, Any]) -> Trajectory:
  return Trajectory(**{k: d[k] for k in ("task_id", "token_ids", "action_mask", "rollout_logprobs", "reward",
                                         "policy_version", "num_turns", "status", "harness", "timings", "metrics",
                                         "metadata")}, turn_boundaries=tuple(d["turn_boundaries"]))
