"""code_repair: fix the one planted bug in a few-line Python program so that its tests pass.

Tools: `view()` lists the program with line numbers; `edit(line, text)` replaces one line; `run_tests()` reports
"k/n passed" and the first failure; `submit()` ends the episode. Reward 1 iff the submitted program passes every
test. Tests run in a resource-limited subprocess with a timeout (`sandbox.run_tests`): a program that hangs,
crashes or does not parse yields an observation, never an exception.

Tasks carry their solution (for the scripted expert and for audits); the model only ever sees the messages.
"""
from __future__ import annotations

import numpy as np

from sao.rollout import tool_format
from sao.rollout.envs import code_repair_tasks
from sao.rollout.envs import sandbox
from sao.rollout.envs.base import Env, Task
from sao.rollout.envs.registry import register
from sao.rollout.tool_format import ToolCall


@register("code_repair")
class CodeRepair(Env):
  """Config: `max_turns` (default 8; the expert needs 4), `timeout_s` per test run, `memory_mb` per test run."""
  name = "code_repair"
  system_prompt = "Fix the bug in f so all tests pass. Tools: view, edit, run_tests, submit."
  tool_schemas = [
      tool_format.function_tool("view", "Show the program with line numbers."),
      tool_format.function_tool("edit", "Replace one line of the program.",
                                {"line": {"type": "integer", "description": "line number, from 1"},
                                 "text": {"type": "string", "description": "the new line, with its indentation"}}),
      tool_format.function_tool("run_tests", "Run the tests."),
      tool_format.function_tool("submit", "Submit the program and end."),
  ]

  def __init__(self, max_turns: int = 8, timeout_s: float = 2.0, memory_mb: int = 256):
    super().__init__()
    if max_turns < 1:
      raise ValueError(f"max_turns: must be >= 1, got {max_turns}")
    if timeout_s <= 0:
      raise ValueError(f"timeout_s: must be > 0, got {timeout_s}")
    self.config_max_turns = int(max_turns)
    self.timeout_s = float(timeout_s)
    self.memory_mb = int(memory_mb)
    self.lines: list[str] = []
    self._viewed = False
    self._tested = False  # tests ran on the current program
    self._submitted = False
    self._passed = False
    self._tests: list[tuple[str, object]] = []
    self._timeout_s = self.timeout_s
    self._report_cache: dict[str, sandbox.TestReport] = {}

  def task_pool(self) -> list[Task]:
    return [dict(t, env=self.name, max_turns=self.config_max_turns, timeout_s=self.timeout_s)
            for t in code_repair_tasks.task_pool()]

  @property
  def program(self) -> str:
    return "\n".join(self.lines) + "\n"

  def _reset(self, task: Task) -> str:
    self.lines = task["program"].splitlines()
    self._tests = [(expr, expected) for expr, expected in task["tests"]]
    self._timeout_s = float(task.get("timeout_s", self.timeout_s))
    self._viewed = self._tested = self._submitted = False
    self._passed = False
    self._report_cache = {}
    return "f fails its tests. Fix it."

  def _run(self) -> sandbox.TestReport:
    # Programs are deterministic, so a rerun of unchanged code (run_tests then submit) reuses the report.
    program = self.program
    if program not in self._report_cache:
      self._report_cache[program] = sandbox.run_tests(program, self._tests, timeout_s=self._timeout_s,
                                                      memory_mb=self.memory_mb)
    return self._report_cache[program]

  def _step(self, call: ToolCall) -> tuple[str, bool]:
    if call.name == "view":
      self._viewed = True
      return "\n".join(f"{i} {line}" for i, line in enumerate(self.lines, 1)), False
    if call.name == "edit":
      line, text = call.arguments["line"], call.arguments["text"]
      if not 1 <= line <= len(self.lines):
        return f"error: line must be in 1..{len(self.lines)}", False
      if "\n" in text:
        return "error: text must be one line", False
      if self.lines[line - 1] != text:
        self.lines[line - 1] = text
        self._tested = False
      return "ok", False
    if call.name == "run_tests":
      self._tested = True
      return self._run().summary(), False
    if call.name == "submit":
      report = self._run()
      self._submitted = True
      self._passed = report.all_passed
      return report.summary(), True
    raise AssertionError(f"unreachable: {call.name!r} passed the schema check")

  def score(self) -> float:
    return 1.0 if self._submitted and self._passed else 0.0

  def expert_action(self) -> ToolCall:
    if not self._viewed:
      return ToolCall("view", {})
    solution = self.task["solution"].splitlines()
    for i, (have, want) in enumerate(zip(self.lines, solution), 1):
      if have != want:
        return ToolCall("edit", {"line": i, "text": want})
    if not self._tested:
      return ToolCall("run_tests", {})
    return ToolCall("submit", {})

  def noisy_action(self, rng: np.random.Generator) -> ToolCall:
    # A weak agent's mistakes: redundant looks, premature submits, and edits that copy a random line of the
    # original (buggy) program onto a random line (often re-planting the bug or breaking the program).
    kind = rng.choice(["view", "run_tests", "submit", "edit"])
    if kind != "edit":
      return ToolCall(str(kind), {})
    original = self.task["program"].splitlines()
    line = int(rng.integers(1, len(self.lines) + 1))
    return ToolCall("edit", {"line": line, "text": original[int(rng.integers(len(original)))]})
