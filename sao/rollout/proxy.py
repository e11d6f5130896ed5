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
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from typing import Any, Mapping, Sequence

from aiohttp import web

from sao.engines.sglang_client import EngineError
from sao.models.sampling import SamplingParams
from sao.models.tokenizer import ChatTemplateError, Tokenizer
from sao.rollout import tool_format
from sao.rollout.agent import Engine, TokenStream, message_boundaries, parse_weight_version
from sao.transport.trajectory import Status, Trajectory

log = logging.getLogger(__name__)


class ProxyRequestError(ValueError):
  """A chat request the proxy cannot serve (HTTP 400)."""


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

@dataclasses.dataclass
class Session:
  segments: list[Segment] = dataclasses.field(default_factory=list)
  lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)


def _divergence(seen: Sequence[tuple], new: Sequence[tuple]) -> int:
  return next((i for i, (a, b) in enumerate(zip(seen, new)) if a != b), min(len(seen), len(new)))


class TokenCapturingProxy:
  """The proxy's state and handlers. `app()` gives the aiohttp application; `trajectories()` the records."""

  def __init__(self, engine: Engine, tokenizer: Tokenizer, default_max_tokens: int = 1024, harness: str = "proxy"):
    self.engine = engine
    self.tokenizer = tokenizer
    self.default_max_tokens = default_max_tokens
    self.harness = harness
    self.sessions: dict[str, Session] = {}
    self._stop_ids = tuple(tokenizer.eos_token_ids)
    if not self._stop_ids:
      raise ValueError("the tokenizer has no eos token to end assistant turns")
    self._end_ids = tokenizer.assistant_end_ids()
    self._gen_prompt_len = len(tokenizer.generation_prompt_ids())

  # ---- one chat completion --------------------------------------------------------------------------------------

  def _sampling(self, body: Mapping[str, Any]) -> SamplingParams:
    if body.get("stream"):
      raise ProxyRequestError("stream: streaming is not supported by the token-capturing proxy")
    if body.get("n", 1) != 1:
      raise ProxyRequestError("n: only one choice per request is supported")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or self.default_max_tokens
    return SamplingParams(max_new_tokens=int(max_tokens), temperature=float(body.get("temperature", 1.0)),
                          top_p=float(body.get("top_p", 1.0)), top_k=int(body.get("top_k", 0) or 0),
                          stop_token_ids=self._stop_ids)

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
    """Serves one OpenAI chat-completions request for `session_id`; returns the OpenAI response object."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
      raise ProxyRequestError("messages: required, a non-empty list")
    messages = [dict(m) for m in messages]
    tools = body.get("tools") or None
    sampling = self._sampling(body)
    session = self.sessions.setdefault(session_id, Session())
    async with session.lock:
      try:
        seg = self._extend_or_start(session, messages, tools)
      except ChatTemplateError as e:
        raise ProxyRequestError(f"chat template: {e}") from e
      seg.mark(len(seg.token_ids) - self._gen_prompt_len)
      start = time.monotonic()
      try:
        result = await self.engine.generate(seg.token_ids, sampling)
      except EngineError:
        seg.status = Status.ENV_ERROR
        raise
      finally:
        seg.generate_s += time.monotonic() - start
      ids = list(result.token_ids)
      if not ids or len(result.logprobs) != len(ids):
        seg.status = Status.ENV_ERROR
        raise EngineError("/generate", f"unusable result (finish {result.finish_reason}, {len(ids)} tokens)")
      seg.append(ids, result.logprobs)
      seg.num_turns += 1
      version = parse_weight_version(result.weight_version)
      seg.versions.append(0 if version is None else version)
      ended_on_stop = result.finish_reason == "stop" and ids[-1] in self._stop_ids
      seg.pending_close = ([] if ended_on_stop else [self._stop_ids[0]]) + list(self._end_ids)
      text = self.tokenizer.decode(ids[:-1] if ended_on_stop else ids)
      message, finish = self._response_message(text, tools, ended_on_stop)
      seg.messages.append(message)
      seg.seen.append(normalize_message(message))
    prompt_tokens = int(result.prompt_tokens or 0)
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": str(body.get("model", "sao")),
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(ids),
                      "total_tokens": prompt_tokens + len(ids)}}

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
          metrics={"num_action_tokens": float(sum(seg.action_mask))}, metadata=metadata))
    return out

  def pop_session(self, session_id: str) -> Session | None:
    return self.sessions.pop(session_id, None)

  # ---- HTTP -----------------------------------------------------------------------------------------------------

  def app(self) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)

    async def chat(request: web.Request) -> web.Response:
      try:
        body = await request.json()
      except ValueError as e:
        return _openai_error(400, f"request body is not valid JSON: {e}", "invalid_request_error")
      try:
        if not isinstance(body, Mapping):
          raise ProxyRequestError("request body must be a JSON object")
        return web.json_response(await self.chat_completion(request.match_info["session_id"], body))
      except ProxyRequestError as e:
        return _openai_error(400, str(e), "invalid_request_error")
      except EngineError as e:
        log.warning("session %s: engine failed: %s", request.match_info["session_id"], e)
        return _openai_error(502, str(e), "engine_error")

    async def trajectory(request: web.Request) -> web.Response:
      sid = request.match_info["session_id"]
      if sid not in self.sessions:
        return _openai_error(404, f"unknown session {sid!r}", "not_found")
      return web.json_response({"session_id": sid,
                                "segments": [trajectory_to_json(t) for t in self.trajectories(sid)]})

    app.router.add_post("/sessions/{session_id}/v1/chat/completions", chat)
    app.router.add_get("/sessions/{session_id}/trajectory", trajectory)
    return app


def _openai_error(status: int, message: str, kind: str) -> web.Response:
  return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


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
