"""`openai_tools`: an OpenHands-style scaffold — the environment's tools (for "swe": `str_replace_editor`, `bash`,
`submit`) passed as OpenAI `tools`, one tool call per model turn, results sent back as `tool` messages.

    messages = env.reset(task)                                  # [system, user]
    loop:  response = chat.completions.create(messages, tools)  # through the token-capturing proxy
           tool call  → env.step(call) → {"role": "tool", "tool_call_id": ..., "content": observation}
           no call    → the environment's error observation as a `user` message (the turn still counts)
    until the environment ends the episode (e.g. `submit`), or the turn / token budget is spent.

The proxy renders the tools with the model's chat template and turns the sampled `<tool_call>` into OpenAI
`tool_calls`, so the policy's text is the template's own tool-call format (`format_call` writes it for the expert).
Works with any environment (its tools are whatever `env.tool_schemas` lists).
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

import openai

from sao.rollout import tool_format
from sao.rollout.envs.base import Env
from sao.rollout.harnesses.proxied import ProxiedHarness, ScaffoldSettings
from sao.rollout.harnesses.registry import register
from sao.rollout.tool_format import ToolCall, ToolCallError, ToolCallErrorCode
from sao.transport.trajectory import Status


def _call_of(message: Any) -> ToolCall | ToolCallError:
  """The first tool call of an OpenAI assistant message, or the error observation's reason."""
  if not message.tool_calls:
    return ToolCallError(ToolCallErrorCode.NO_TOOL_CALL, "no tool call; call one of the tools")
  fn = message.tool_calls[0].function
  try:
    arguments = json.loads(fn.arguments or "{}")
  except json.JSONDecodeError as e:
    return ToolCallError(ToolCallErrorCode.INVALID_JSON, f"invalid JSON in arguments at char {e.pos}")
  if not isinstance(arguments, dict):
    return ToolCallError(ToolCallErrorCode.BAD_STRUCTURE, "arguments must be a JSON object")
  return ToolCall(fn.name, arguments)


@register
class OpenAITools(ProxiedHarness):
  """OpenAI function calling through the proxy (OpenHands-style editor + bash + submit for "swe")."""
  name = "openai_tools"

  def format_call(self, call: ToolCall, env: Env) -> str:
    del env
    return tool_format.format_tool_call(call)

  async def scaffold(self, client: openai.AsyncOpenAI, env: Env, task: dict[str, Any],
                     settings: ScaffoldSettings) -> Status:
    messages: list[dict[str, Any]] = await asyncio.to_thread(env.reset, task)
    tools = env.tool_schemas
    pending = "".join(str(m["content"]) for m in messages) + json.dumps(tools)
    last_total = 0
    for _ in range(settings.max_turns):
      max_tokens = settings.request_budget(last_total, pending)
      if max_tokens <= 0:
        return Status.TRUNCATED
      response = await client.chat.completions.create(
          model=settings.model, messages=messages, tools=tools, max_tokens=max_tokens,
          temperature=settings.temperature, top_p=settings.top_p)
      last_total = response.usage.total_tokens if response.usage else last_total + max_tokens
      message = response.choices[0].message
      messages.append(message.model_dump(exclude_none=True))
      call = _call_of(message)
      observation, done = await asyncio.to_thread(env.step, call)
      if isinstance(call, ToolCall):
        messages.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": observation})
      else:
        messages.append({"role": "user", "content": observation})
      pending = observation
      if done:
        return Status.OK
    return Status.TRUNCATED
