"""The text format of tool calls in assistant turns, shared by every environment.

Qwen style: an assistant turn contains exactly one call,

    <tool_call>{"name": "compare", "arguments": {"guess": 32}}</tool_call>

optionally preceded by free text (reasoning) and surrounded by whitespace; whitespace/newlines inside the tags are
allowed (Qwen's own template puts the JSON on its own line). `format_tool_call` writes the compact single-line form
above, because the toy policies are character/word-level models with short contexts.

`parse_tool_call` never raises on model output: a malformed call comes back as a `ToolCallError` value, which the
agent loop turns into an error observation (`ToolCallError.observation`) so the model sees its mistake and the
episode goes on.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import re
from typing import Any, Collection, Mapping, Sequence

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"

_CALL_RE = re.compile(re.escape(OPEN_TAG) + r"(.*?)" + re.escape(CLOSE_TAG), re.DOTALL)
_JSON_TYPES = {
    "integer": (int,), "number": (int, float), "string": (str,), "boolean": (bool,),
    "object": (dict,), "array": (list,),
}


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """One tool invocation: the tool's name and its JSON arguments."""
  name: str
  arguments: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class ToolCallErrorCode(enum.StrEnum):
  NO_TOOL_CALL = "no_tool_call"
  UNTERMINATED = "unterminated"
  MULTIPLE_CALLS = "multiple_calls"
  INVALID_JSON = "invalid_json"
  BAD_STRUCTURE = "bad_structure"
  UNKNOWN_TOOL = "unknown_tool"
  BAD_ARGUMENTS = "bad_arguments"


@dataclasses.dataclass(frozen=True)
class ToolCallError:
  """Why an assistant turn holds no usable tool call. Returned by `parse_tool_call`, never raised."""
  code: ToolCallErrorCode
  message: str

  @property
  def observation(self) -> str:
    """The text the model sees in place of a tool result (short: toy contexts are a few hundred tokens)."""
    return f"error: {self.message}"


def format_tool_call(call: ToolCall) -> str:
  """`call` in the assistant-turn text format; `parse_tool_call(format_tool_call(c)) == c`."""
  payload = json.dumps({"name": call.name, "arguments": dict(call.arguments)})
  # A tag inside a string argument (code an agent writes, say) would end the call early; escape it in JSON.
  payload = payload.replace(OPEN_TAG, "\\u003c" + OPEN_TAG[1:]).replace(CLOSE_TAG, "\\u003c" + CLOSE_TAG[1:])
  return OPEN_TAG + payload + CLOSE_TAG


def tool_names(tools: Collection[str] | Sequence[Mapping[str, Any]]) -> list[str]:
  """Names from either plain names or OpenAI function-tool schemas (`{"type": "function", "function": {...}}`)."""
  return [t if isinstance(t, str) else t["function"]["name"] for t in tools]


def check_arguments(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
  """A message describing how `arguments` break an OpenAI function-tool `schema`, or None if they fit.

  Checks required keys, unknown keys and primitive JSON types (a bool is not an integer, as in JSON Schema).
  """
  fn = schema["function"]
  params = fn.get("parameters", {})
  props = params.get("properties", {})
  missing = [k for k in params.get("required", []) if k not in arguments]
  if missing:
    return f"{fn['name']}: missing argument {missing[0]!r}"
  unknown = [k for k in arguments if k not in props]
  if unknown:
    return f"{fn['name']}: unknown argument {unknown[0]!r}"
  for key, value in arguments.items():
    types = _JSON_TYPES.get(props[key].get("type", ""), None)
    if types is None:
      continue
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
      return f"{fn['name']}: argument {key!r} must be {props[key]['type']}"
  return None


def parse_tool_call(text: str,
                    tools: Collection[str] | Sequence[Mapping[str, Any]] | None = None) -> ToolCall | ToolCallError:
  """The single tool call in an assistant turn, or the reason there is none.

  Args:
    text: the assistant turn's decoded text.
    tools: the tools the environment offers, as names or OpenAI function-tool schemas. With names, unknown tools
      are rejected; with schemas, arguments are also checked (`check_arguments`). None accepts any name.

  Returns:
    A `ToolCall`, or a `ToolCallError` (never raised).
  """
  matches = _CALL_RE.findall(text)
  if not matches:
    if OPEN_TAG in text:
      return ToolCallError(ToolCallErrorCode.UNTERMINATED, f"missing {CLOSE_TAG}")
    return ToolCallError(ToolCallErrorCode.NO_TOOL_CALL, f"no {OPEN_TAG}")
  if len(matches) > 1:
    return ToolCallError(ToolCallErrorCode.MULTIPLE_CALLS, "one tool call per turn")
  return call_from_json(matches[0], tools)


def call_from_json(text: str,
                   tools: Collection[str] | Sequence[Mapping[str, Any]] | None = None) -> ToolCall | ToolCallError:
  """The call in a JSON object `{"name": ..., "arguments": {...}}` (arguments may be a JSON string), checked against
  `tools` as `parse_tool_call` does; a `ToolCallError` if it is not one."""
  try:
    payload = json.loads(text)
  except json.JSONDecodeError as e:
    return ToolCallError(ToolCallErrorCode.INVALID_JSON, f"invalid JSON at char {e.pos}")
  if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
    return ToolCallError(ToolCallErrorCode.BAD_STRUCTURE, 'expected {"name": ..., "arguments": {...}}')
  arguments = payload.get("arguments", {})
  if isinstance(arguments, str):  # some chat templates/models emit arguments as a JSON string (OpenAI wire style)
    try:
      arguments = json.loads(arguments)
    except json.JSONDecodeError as e:
      return ToolCallError(ToolCallErrorCode.INVALID_JSON, f"invalid JSON in arguments at char {e.pos}")
  if not isinstance(arguments, dict) or set(payload) - {"name", "arguments"}:
    return ToolCallError(ToolCallErrorCode.BAD_STRUCTURE, 'expected {"name": ..., "arguments": {...}}')
  return check_call(ToolCall(payload["name"], arguments), tools)


def check_call(call: ToolCall,
               tools: Collection[str] | Sequence[Mapping[str, Any]] | None = None) -> ToolCall | ToolCallError:
  """`call` if `tools` offer it (and, with schemas, its arguments fit), else the `ToolCallError` saying why."""
  if tools is None:
    return call
  names = tool_names(tools)
  if call.name not in names:
    return ToolCallError(ToolCallErrorCode.UNKNOWN_TOOL, f"unknown tool {call.name!r}")
  schema = next((t for t in tools if not isinstance(t, str) and t["function"]["name"] == call.name), None)
  if schema is not None:
    problem = check_arguments(schema, call.arguments)
    if problem is not None:
      return ToolCallError(ToolCallErrorCode.BAD_ARGUMENTS, problem)
  return call


def function_tool(name: str, description: str, properties: Mapping[str, Mapping[str, Any]] | None = None,
                  required: Sequence[str] | None = None) -> dict[str, Any]:
  """An OpenAI function-tool schema (the format chat templates render and `parse_tool_call` checks against)."""
  properties = dict(properties or {})
  return {
      "type": "function",
      "function": {
          "name": name,
          "description": description,
          "parameters": {
              "type": "object",
              "properties": properties,
              "required": list(properties if required is None else required),
          },
      },
  }
