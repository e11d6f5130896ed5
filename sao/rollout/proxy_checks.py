"""Validation of OpenAI chat-completions requests for the token-capturing proxy, and OpenAI's error shape.

Every field the proxy reads is type- and range-checked before the request touches a session, so a malformed request
is answered 400 (`{"error": {"message", "type", "param", "code"}}`, `param` naming the field) and leaves no trace:
no session is created, no tokens are recorded, and the episode is not marked as an environment failure.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from aiohttp import web

from sao.models.sampling import SamplingParams

ROLES = frozenset({"system", "user", "assistant", "tool"})
MAX_INT32 = 2**31 - 1


class ProxyRequestError(ValueError):
  """A chat request the proxy cannot serve: HTTP `status` (400 unless said otherwise) in OpenAI's error shape."""

  def __init__(self, message: str, param: str | None = None, code: str = "invalid_value", status: int = 400):
    super().__init__(message)
    self.param, self.code, self.status = param, code, status


def openai_error(status: int, message: str, kind: str, param: str | None = None,
                 code: str | None = None) -> web.Response:
  """OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""
  return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": code}},
                           status=status)


def _is_int(x: Any) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def _number(body: Mapping[str, Any], name: str, default: float) -> float:
  value = body.get(name)
  if value is None:
    return default
  if not isinstance(value, (int, float)) or isinstance(value, bool):
    raise ProxyRequestError(f"{name}: expected a number, got {value!r}", name, "invalid_type")
  try:
    value = float(value)
  except OverflowError:
    value = math.inf
  if not math.isfinite(value):
    raise ProxyRequestError(f"{name}: must be a finite number, got {body.get(name)!r}", name)
  return value


def _integer(body: Mapping[str, Any], name: str) -> int | None:
  value = body.get(name)
  if value is None:
    return None
  if not _is_int(value):
    raise ProxyRequestError(f"{name}: expected an integer, got {value!r}", name, "invalid_type")
  if abs(value) > MAX_INT32:
    raise ProxyRequestError(f"{name}: {value} is out of range", name)
  return value


def _check_tool_calls(calls: Any, where: str) -> None:
  if calls is None:
    return
  if not isinstance(calls, list):
    raise ProxyRequestError(f"{where}: expected a list of tool calls, got {calls!r}", where, "invalid_type")
  for j, call in enumerate(calls):
    at = f"{where}[{j}]"
    if not isinstance(call, Mapping):
      raise ProxyRequestError(f"{at}: expected an object, got {call!r}", at, "invalid_type")
    fn = call.get("function", call)
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
      raise ProxyRequestError(f"{at}.function: expected an object with a string 'name', got {fn!r}", at,
                              "invalid_type")
    if not isinstance(fn.get("arguments", {}), (str, Mapping)):
      raise ProxyRequestError(f"{at}.function.arguments: expected a JSON string or an object", at, "invalid_type")


def _check_content(content: Any, where: str) -> None:
  if content is None or isinstance(content, str):
    return
  if not isinstance(content, list):
    raise ProxyRequestError(f"{where}: expected a string or a list of text parts, got {type(content).__name__}",
                            where, "invalid_type")
  for j, part in enumerate(content):
    if not isinstance(part, Mapping) or part.get("type", "text") != "text" or not isinstance(part.get("text"), str):
      raise ProxyRequestError(f"{where}[{j}]: only text parts ({{'type': 'text', 'text': str}}) are supported, "
                              f"got {part!r}", f"{where}[{j}]", "invalid_type")


def check_messages(messages: Any) -> list[dict[str, Any]]:
  """A non-empty list of OpenAI chat messages → plain dicts; raises `ProxyRequestError` naming the message."""
  if not isinstance(messages, list) or not messages:
    raise ProxyRequestError("messages: required, a non-empty list", "messages")
  for i, m in enumerate(messages):
    where = f"messages[{i}]"
    if not isinstance(m, Mapping):
      raise ProxyRequestError(f"{where}: expected a message object, got {m!r}"[:500], where, "invalid_type")
    if m.get("role") not in ROLES:
      raise ProxyRequestError(f"{where}.role: expected one of {sorted(ROLES)}, got {m.get('role')!r}",
                              f"{where}.role")
    _check_content(m.get("content"), f"{where}.content")
    _check_tool_calls(m.get("tool_calls"), f"{where}.tool_calls")
    for key in ("tool_call_id", "name"):
      if m.get(key) is not None and not isinstance(m[key], str):
        raise ProxyRequestError(f"{where}.{key}: expected a string, got {m[key]!r}", f"{where}.{key}",
                                "invalid_type")
  return [dict(m) for m in messages]


def check_tools(tools: Any) -> list[dict[str, Any]] | None:
  """OpenAI `tools` (function schemas) or None."""
  if tools is None or tools == []:
    return None
  if not isinstance(tools, list):
    raise ProxyRequestError(f"tools: expected a list of tool schemas, got {type(tools).__name__}", "tools",
                            "invalid_type")
  for j, tool in enumerate(tools):
    fn = tool.get("function") if isinstance(tool, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
      raise ProxyRequestError(f"tools[{j}]: expected {{'type': 'function', 'function': {{'name': str, ...}}}}, "
                              f"got {tool!r}"[:500], f"tools[{j}]", "invalid_type")
  return tools


# Fields that would change what is sampled (so the recorded tokens and log-probs would not be the policy's): the
# proxy refuses them rather than ignoring them. Each maps to the values that mean "off".
_UNSUPPORTED_SAMPLING = {
    "stop": (None, [], ""),  # stop strings: the engine stops on token ids only (eos / end of turn)
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "min_p": (None, 0, 0.0),
}


def check_sampling(body: Mapping[str, Any], default_max_tokens: int,
                   stop_ids: tuple[int, ...]) -> SamplingParams:
  """The request's sampling settings: max_completion_tokens / max_tokens ≥ 1, temperature ≥ 0 (0 = greedy),
  0 < top_p ≤ 1, top_k ≥ -1 (0 / -1 = off), n = 1, no streaming; stop strings, logit bias and penalties are refused
  (400, `unsupported_value`) unless off, since the engine would not apply them."""
  if body.get("stream") not in (None, False):
    raise ProxyRequestError("stream: streaming is not supported by the token-capturing proxy", "stream",
                            "unsupported_value")
  for name, off in _UNSUPPORTED_SAMPLING.items():
    value = body.get(name)
    if not any(value == o and type(value) is type(o) for o in off):  # noqa: E721 -- False == 0 must not pass
      raise ProxyRequestError(f"{name}: not supported by the token-capturing proxy (got {value!r}); the policy's "
                              f"own sampling must produce the recorded tokens, so only the off value is accepted",
                              name, "unsupported_value")
  n = _integer(body, "n")
  if n not in (None, 1):
    raise ProxyRequestError("n: only one choice per request is supported", "n", "unsupported_value")
  max_tokens = default_max_tokens
  for name in ("max_tokens", "max_completion_tokens"):  # the newer name wins when both are given
    value = _integer(body, name)
    if value is not None:
      if value < 1:
        raise ProxyRequestError(f"{name}: must be >= 1, got {value}", name)
      max_tokens = value
  temperature = _number(body, "temperature", 1.0)
  if temperature < 0:
    raise ProxyRequestError(f"temperature: must be >= 0, got {temperature}", "temperature")
  top_p = _number(body, "top_p", 1.0)
  if not 0 < top_p <= 1:
    raise ProxyRequestError(f"top_p: must be in (0, 1], got {top_p}", "top_p")
  top_k = _integer(body, "top_k") or 0
  if top_k < -1:
    raise ProxyRequestError(f"top_k: must be -1 or 0 (off) or positive, got {top_k}", "top_k")
  return SamplingParams(max_new_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=max(top_k, 0),
                        stop_token_ids=stop_ids)


@dataclasses.dataclass(frozen=True)
class ChatRequest:
  """A checked chat-completions request."""
  messages: list[dict[str, Any]]
  tools: list[dict[str, Any]] | None
  sampling: SamplingParams
  model: str


def check_chat_request(body: Any, default_max_tokens: int, stop_ids: tuple[int, ...]) -> ChatRequest:
  if not isinstance(body, Mapping):
    raise ProxyRequestError("request body must be a JSON object")
  model = body.get("model", "sao")
  if not isinstance(model, str):
    raise ProxyRequestError(f"model: expected a string, got {model!r}", "model", "invalid_type")
  return ChatRequest(messages=check_messages(body.get("messages")), tools=check_tools(body.get("tools")),
                     sampling=check_sampling(body, default_max_tokens, stop_ids), model=model)
