"""Tool-call syntaxes: harnesses that run the built-in agent loop with their own tool presentation and call format.

The toy analogue of training through several agent scaffolds (the mixed-harness experiment): the same tasks, the
same tool semantics, different text conventions the policy must follow.

- `xml_json` (Qwen style, the chat template's own): tools rendered by the template's tools header, calls as
  `<tool_call>{"name": "compare", "arguments": {"guess": 5}}</tool_call>`.
- `xml_json_system`: the same `<tool_call>{json}</tool_call>` calls, for chat templates without a tools header
  (SmolLM2's): the tools are listed as JSON schemas inside `<tools>...</tools>` in the system message, as
  SmolLM2-1.7B-Instruct's function-calling instructions do, and a call may also be their one-element list
  `<tool_call>[{"name": ..., "arguments": {...}}]</tool_call>`.
- `json_block`: tools listed as JSON schemas in the system message, calls as a fenced block
  ```` ```json\\n{"name": "compare", "arguments": {"guess": 5}}\\n``` ````.
- `function_call`: tools listed as Python-style signatures in the system message, calls as `compare(guess=5)`
  (keyword arguments, Python literals).

In all but `xml_json` the template gets no `tools` (its tools header would teach the `<tool_call>` format); the harness
writes the tool list into the system message instead. Parsing never raises: a malformed call is a `ToolCallError`
that the environment answers with an error observation, as in `tool_format`.
"""
from __future__ import annotations

import ast
import json
import re
from typing import Any, Callable, Mapping, Sequence

from sao.models.sampling import SamplingParams
from sao.models.tokenizer import Tokenizer
from sao.rollout import agent, tool_format
from sao.rollout.envs.base import Env
from sao.rollout.harnesses.base import Harness
from sao.rollout.harnesses.registry import register
from sao.rollout.tool_format import ToolCall, ToolCallError, ToolCallErrorCode
from sao.transport.trajectory import Trajectory

TOOLS_HEADER = "\n\nTools:\n"
JSON_BLOCK_OPEN = "```json\n"
JSON_BLOCK_CLOSE = "\n```"
JSON_BLOCK_INSTRUCTION = 'Call a tool with ```json\n{"name": NAME, "arguments": ARGS}\n```.'
XML_TOOLS_OPEN = "\n\nYou have access to the following tools:\n<tools>\n"
XML_TOOLS_CLOSE = "\n</tools>\n"
XML_JSON_INSTRUCTION = 'Call a tool with <tool_call>{"name": NAME, "arguments": ARGS}</tool_call>.'
FUNCTION_CALL_INSTRUCTION = "Call a tool as a Python call: NAME(ARG=VALUE, ...)."

_JSON_BLOCK_RE = re.compile(r"```json[ \t]*\n(.*?)\n?```", re.DOTALL)
_XML_CALL_RE = re.compile(re.escape(tool_format.OPEN_TAG) + r"(.*?)" + re.escape(tool_format.CLOSE_TAG), re.DOTALL)
_CALL_START_RE = re.compile(r"(?<![A-Za-z0-9_.])([A-Za-z_][A-Za-z0-9_]*)\(")


def with_tool_list(messages: Sequence[Mapping[str, Any]], tool_text: str) -> list[dict]:
  """`messages` with `tool_text` appended to the system message (one is added first if there is none)."""
  out = [dict(m) for m in messages]
  if out and out[0].get("role") == "system":
    out[0]["content"] = str(out[0].get("content") or "") + tool_text
  else:
    out.insert(0, {"role": "system", "content": tool_text.lstrip("\n")})
  return out


class SyntaxHarness(Harness):
  """The agent loop with this class's `present` / `parse_call` (the `agent.ToolSyntax` protocol)."""

  def present(self, messages: Sequence[dict], tool_schemas: Sequence[dict]) -> tuple[list[dict], list[dict] | None]:
    raise NotImplementedError

  def parse_call(self, text: str, tool_schemas: Sequence[dict]) -> ToolCall | ToolCallError:
    raise NotImplementedError

  def format_text(self, call: ToolCall) -> str:
    raise NotImplementedError

  def format_call(self, call: ToolCall, env: Env) -> str:
    del env
    return self.format_text(call)

  async def run_episode(self, engine: agent.Engine, tokenizer: Tokenizer, env: Env, task: dict[str, Any],
                        sampling: SamplingParams, limits: agent.EpisodeLimits, *,
                        policy_version_fn: Callable[[], int] | None = None, sample_index: int = 0,
                        group_id: str = "", lease_id: str = "") -> Trajectory:
    return await agent.run_episode(engine, tokenizer, env, task, sampling, limits, policy_version_fn,
                                   sample_index=sample_index, group_id=group_id, harness=self.name,
                                   lease_id=lease_id, syntax=self)


@register
class XmlJson(SyntaxHarness):
  """Qwen's `<tool_call>{json}</tool_call>`, tools in the chat template's header (what `tool_format` speaks)."""
  name = "xml_json"

  def present(self, messages, tool_schemas):
    return [dict(m) for m in messages], list(tool_schemas)

  def parse_call(self, text, tool_schemas):
    return tool_format.parse_tool_call(text, tool_schemas)

  def format_text(self, call):
    return tool_format.format_tool_call(call)


@register
class XmlJsonSystem(SyntaxHarness):
  """`<tool_call>{json}</tool_call>` calls with the tools in the system message (`<tools>` JSON schemas, one a line),
  for templates that render no tools (SmolLM2-Instruct's ChatML). A one-element JSON list inside the tags (the
  format of SmolLM2-1.7B-Instruct's function-calling instructions) is read as its one call; a longer list is
  `MULTIPLE_CALLS`."""
  name = "xml_json_system"

  def present(self, messages, tool_schemas):
    listing = "\n".join(json.dumps(t["function"]) for t in tool_schemas)
    return with_tool_list(messages, f"{XML_TOOLS_OPEN}{listing}{XML_TOOLS_CLOSE}{XML_JSON_INSTRUCTION}"), None

  def parse_call(self, text, tool_schemas):
    call = tool_format.parse_tool_call(text, tool_schemas)
    if not (isinstance(call, ToolCallError) and call.code is ToolCallErrorCode.BAD_STRUCTURE):
      return call
    payload = json.loads(_XML_CALL_RE.search(text).group(1))  # parsed once already: valid JSON, not a call object
    if not isinstance(payload, list) or not payload:
      return call
    if len(payload) > 1:
      return ToolCallError(ToolCallErrorCode.MULTIPLE_CALLS, "one tool call per turn")
    return tool_format.call_from_json(json.dumps(payload[0]), tool_schemas)

  def format_text(self, call):
    return tool_format.format_tool_call(call)


@register
class JsonBlock(SyntaxHarness):
  """A fenced ```json block holding `{"name": ..., "arguments": {...}}`; tools as JSON schemas in the system text."""
  name = "json_block"

  def present(self, messages, tool_schemas):
    listing = "\n".join(json.dumps(t["function"]) for t in tool_schemas)
    return with_tool_list(messages, f"{TOOLS_HEADER}{listing}\n{JSON_BLOCK_INSTRUCTION}"), None

  def parse_call(self, text, tool_schemas):
    blocks = _JSON_BLOCK_RE.findall(text)
    if not blocks:
      if "```json" in text:
        return ToolCallError(ToolCallErrorCode.UNTERMINATED, "missing closing ```")
      return ToolCallError(ToolCallErrorCode.NO_TOOL_CALL, "no ```json block")
    if len(blocks) > 1:
      return ToolCallError(ToolCallErrorCode.MULTIPLE_CALLS, "one tool call per turn")
    return tool_format.call_from_json(blocks[0], tool_schemas)

  def format_text(self, call):
    payload = json.dumps({"name": call.name, "arguments": dict(call.arguments)})
    # A backtick fence inside a string argument would end the block early; JSON escapes it.
    return JSON_BLOCK_OPEN + payload.replace("`", "\\u0060") + JSON_BLOCK_CLOSE


def signature(schema: Mapping[str, Any]) -> str:
  """`name(arg: type, opt?: type) - description` for a function-tool schema."""
  fn = schema["function"]
  params = fn.get("parameters", {})
  required = set(params.get("required", []))
  args = ", ".join(f"{k}{'' if k in required else '?'}: {v.get('type', 'any')}"
                   for k, v in params.get("properties", {}).items())
  return f"{fn['name']}({args}) - {fn.get('description', '')}".rstrip(" -")


def _python_literal(value: Any) -> str:
  if isinstance(value, (dict, list, str, int, float, bool)) or value is None:
    return repr(value)
  raise TypeError(f"function_call: argument value {value!r} is not a JSON value")


@register
class FunctionCall(SyntaxHarness):
  """A Python-style call `name(arg=value, ...)` with literal keyword arguments; tools as signatures."""
  name = "function_call"

  def present(self, messages, tool_schemas):
    listing = "\n".join(signature(t) for t in tool_schemas)
    return with_tool_list(messages, f"{TOOLS_HEADER}{listing}\n{FUNCTION_CALL_INSTRUCTION}"), None

  def parse_call(self, text, tool_schemas):
    names = set(tool_format.tool_names(tool_schemas))
    starts = [m for m in _CALL_START_RE.finditer(text)]
    known = [m for m in starts if m.group(1) in names]
    candidates = known or starts  # an unknown name still parses, so the error can say "unknown tool"
    if not candidates:
      return ToolCallError(ToolCallErrorCode.NO_TOOL_CALL, "no call like name(arg=value)")
    problem = None
    for i, match in enumerate(candidates):
      try:
        node = ast.parse(text[match.start():].strip(), mode="eval").body
      except SyntaxError:
        problem = problem or ToolCallError(ToolCallErrorCode.BAD_STRUCTURE, "not a Python call name(arg=value)")
        continue
      if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        problem = problem or ToolCallError(ToolCallErrorCode.BAD_STRUCTURE, "the turn must end with one call")
        continue
      if any(self._parses(text[m.start():match.start()]) for m in candidates[:i]):
        return ToolCallError(ToolCallErrorCode.MULTIPLE_CALLS, "one tool call per turn")
      if node.args or any(kw.arg is None for kw in node.keywords):
        return ToolCallError(ToolCallErrorCode.BAD_ARGUMENTS, f"{node.func.id}: keyword arguments only")
      try:
        arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
      except (ValueError, SyntaxError, TypeError):
        return ToolCallError(ToolCallErrorCode.BAD_ARGUMENTS, f"{node.func.id}: argument values must be literals")
      return tool_format.check_call(ToolCall(node.func.id, arguments), tool_schemas)
    return problem

  @staticmethod
  def _parses(source: str) -> bool:
    try:
      return isinstance(ast.parse(source.strip(), mode="eval").body, ast.Call)
    except SyntaxError:
      return False

  def format_text(self, call):
    args = ", ".join(f"{k}={_python_literal(v)}" for k, v in call.arguments.items())
    return f"{call.name}({args})"
