"""Chat templates rendered the way `transformers` renders them: a sandboxed jinja2 environment set up like its own
(`trim_blocks`, `lstrip_blocks`, `raise_exception`, a `tojson` that does not HTML-escape, `strftime_now`,
`loopcontrols`) and messages normalised as it normalises them (plain deep copies, None-valued keys dropped, the
reasoning under every name templates read). `sao.models.tokenizer.Tokenizer` renders through these.
"""
from __future__ import annotations

import copy
import datetime
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

# Names a message's reasoning goes under; templates read the first, gpt-oss ones read `thinking`.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
  """The tokenizer has no chat template, or the template rejected the conversation."""


class TemplatePrefixError(ChatTemplateError):
  """Rendering `history + new` does not extend the rendering of `history`, so no incremental suffix exists."""


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
  # Jinja's own `tojson` HTML-escapes `<`, `>`, `&`, `'`; chat templates expect plain JSON.
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
  raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
  return datetime.datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=64)
def compile_chat_template(source: str) -> jinja2.Template:
  """Compiles a chat template in a sandboxed environment configured like transformers' (cached per source)."""
  env = jinja2.sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
  env.filters["tojson"] = _tojson
  env.globals["raise_exception"] = _raise_exception
  env.globals["strftime_now"] = _strftime_now
  return env.from_string(source)


def plain_copy(value: Any) -> Any:
  """`copy.deepcopy` for JSON-like values (dict, list, tuple, str, numbers, None), several times faster on the
  small chats an agent loop renders every turn; anything else goes through `copy.deepcopy` itself. Chat messages
  are JSON values, so shared sub-objects are copied separately and a cyclic value is a RecursionError."""
  t = type(value)
  if t is str or t is int or t is float or t is bool or value is None:
    return value
  if t is dict:
    return {plain_copy(k): plain_copy(v) for k, v in value.items()}
  if t is list:
    return [plain_copy(v) for v in value]
  if t is tuple:
    return tuple(plain_copy(v) for v in value)
  return copy.deepcopy(value)


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """Deep-copies messages to plain dicts as transformers does: None-valued keys dropped, reasoning aliased."""
  out = []
  for message in messages:
    if not isinstance(message, Mapping):
      raise TypeError(f"chat messages must be dicts, got {message!r}")
    m = {k: plain_copy(v) for k, v in message.items() if v is not None}
    reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
    if reasoning is not None:
      m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
    out.append(m)
  return out
