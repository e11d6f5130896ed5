r"""`bash_only`: a scaffold in the style of mini-swe-agent — no tool API, one ```bash block per model turn.

    [system: the bash-only rules]  [user: the environment's task statement]
    loop:  response = chat.completions.create(messages)         # plain text, through the token-capturing proxy
           exactly one ```bash block → env.step(bash(command)) → user message "<output>\n...\n</output>"
           `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`         → env.step(submit()) (mini-swe-agent's finish word)
           zero or several blocks → a format-error user message (the turn still counts)
    until the environment ends the episode, or the turn / token budget is spent.

As in mini-swe-agent, observations come back as `user` messages and the command is parsed from the text with
mini-swe-agent's action pattern (```bash\n...\n```). The environment must offer a `bash` tool (and `submit` for
the finish word to end the episode). Edits are shell commands, so the scripted expert's editor calls are written as
equivalent commands (`editor_as_bash`: `cat -n`, a `python3` heredoc for str_replace/insert/create).
"""
from __future__ import annotations

import asyncio
import re
from typing import Any

import openai

from sao.rollout import tool_format
from sao.rollout.envs.base import Env
from sao.rollout.envs.swe import expert as swe_expert
from sao.rollout.harnesses.proxied import ProxiedHarness, ScaffoldError, ScaffoldSettings
from sao.rollout.harnesses.registry import register
from sao.rollout.tool_format import ToolCall, ToolCallError, ToolCallErrorCode
from sao.transport.trajectory import Status

SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
ACTION_RE = re.compile(r"```bash\s*\n(.*?)\n```", re.DOTALL)
SYSTEM_PROMPT = (
    "You are a helpful assistant that can interact with a computer shell to solve programming tasks.\n"
    "Your response must contain exactly ONE bash code block with ONE command (or commands connected with && or "
    "||), formatted as:\n```bash\nyour_command_here\n```\nEach command runs in a fresh shell. When the task is "
    f"done, run `{SUBMIT_COMMAND}` alone.")
_HEREDOC = "SAO_EOF"


def _heredoc(script: str) -> str:
  delimiter = _HEREDOC
  while delimiter in script:
    delimiter += "_"
  return f"python3 - <<'{delimiter}'\n{script}\n{delimiter}"


def editor_as_bash(call: ToolCall) -> str:
  """A shell command with the effect of an OpenHands `str_replace_editor` call (for the scripted expert)."""
  args = call.arguments
  command, path = args.get("command"), args.get("path", "")
  if command == "view":
    view_range = args.get("view_range")
    if view_range:
      start, end = int(view_range[0]), int(view_range[1])
      return f"cat -n {path} | sed -n '{start},{'$' if end == -1 else end}p'"
    return f"if [ -d {path} ]; then find {path} -maxdepth 2 -not -path '*/.*'; else cat -n {path}; fi"
  if command == "create":
    return _heredoc(f"import pathlib\npathlib.Path({path!r}).write_text({args.get('file_text', '')!r})")
  if command == "str_replace":
    return _heredoc(
        f"import pathlib\np = pathlib.Path({path!r})\ns = p.read_text()\nold, new = {args.get('old_str', '')!r}, "
        f"{args.get('new_str', '')!r}\nassert s.count(old) == 1, f'old_str occurs {{s.count(old)}} times'\n"
        "p.write_text(s.replace(old, new))")
  if command == "insert":
    return _heredoc(
        f"import pathlib\np = pathlib.Path({path!r})\nlines = p.read_text().splitlines(keepends=True)\n"
        f"new = {args.get('new_str', '')!r}\nnew = new if new.endswith('\\n') else new + '\\n'\n"
        f"lines.insert({int(args.get('insert_line', 0))}, new)\np.write_text(''.join(lines))")
  raise ValueError(f"bash_only: no shell equivalent of str_replace_editor command {command!r}")


def parse_action(text: str) -> str | ToolCallError:
  """The one bash command in an assistant turn, or why there is none."""
  actions = ACTION_RE.findall(text)
  if len(actions) != 1:
    return ToolCallError(ToolCallErrorCode.NO_TOOL_CALL if not actions else ToolCallErrorCode.MULTIPLE_CALLS,
                         f"Please always provide EXACTLY ONE action in triple backticks, found {len(actions)} actions.")
  return actions[0].strip()


@register
class BashOnly(ProxiedHarness):
  """mini-swe-agent-style: bash blocks parsed from plain text, observations as user messages."""
  name = "bash_only"

  def format_call(self, call: ToolCall, env: Env) -> str:
    del env
    if call.name == "bash":
      command = call.arguments["command"]
    elif call.name == "submit":
      command = SUBMIT_COMMAND
    elif call.name == "str_replace_editor":
      command = editor_as_bash(call)
    else:
      raise ValueError(f"bash_only: cannot express a {call.name!r} call as a shell command")
    return f"```bash\n{command}\n```"

  def expert_call(self, env: Env, num_expert_calls: int) -> ToolCall:
    # The env's expert advances on the calls it planned; here its editor calls run as bash commands, so follow
    # its plan by count (the "swe" expert's plan is fixed per task and each planned call succeeds).
    if env.name != "swe":
      return super().expert_call(env, num_expert_calls)
    plan = swe_expert.Expert(env.task, env.instance).plan
    return plan[min(num_expert_calls, len(plan) - 1)]

  async def scaffold(self, client: openai.AsyncOpenAI, env: Env, task: dict[str, Any],
                     settings: ScaffoldSettings) -> Status:
    names = tool_format.tool_names(env.tool_schemas)
    if "bash" not in names:
      raise ScaffoldError(f"bash_only needs an environment with a 'bash' tool; {env.name!r} has {names}")
    first = await asyncio.to_thread(env.reset, task)
    statement = next(m["content"] for m in first if m["role"] == "user")
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT},
                                      {"role": "user", "content": statement}]
    pending, last_total = SYSTEM_PROMPT + statement, 0
    for _ in range(settings.max_turns):
      max_tokens = settings.request_budget(last_total, pending)
      if max_tokens <= 0:
        return Status.TRUNCATED
      response = await client.chat.completions.create(
          model=settings.model, messages=messages, max_tokens=max_tokens, temperature=settings.temperature,
          top_p=settings.top_p)
      last_total = response.usage.total_tokens if response.usage else last_total + max_tokens
      text = response.choices[0].message.content or ""
      messages.append({"role": "assistant", "content": text})
      action = parse_action(text)
      if isinstance(action, ToolCallError):
        call = action
      elif action == SUBMIT_COMMAND and "submit" in names:
        call = ToolCall("submit", {})
      else:
        call = ToolCall("bash", {"command": action})
      observation, done = await asyncio.to_thread(env.step, call)
      content = observation if isinstance(call, ToolCallError) else f"<output>\n{observation}\n</output>"
      messages.append({"role": "user", "content": content})
      pending = content
      if done:
        return Status.OK
    return Status.TRUNCATED
