"""number_search: find a hidden integer in [1, N] by asking `compare(guess)`.

The observation is one word: "higher" (the hidden number is higher than the guess), "lower", or "equal" (found; the
episode ends). Reward 1 iff found within `max_turns` calls. The optimal policy is binary search, which needs at most
ceil(log2(N + 1)) calls, so the default budget (8 for N = 64) leaves one spare turn.
"""
from __future__ import annotations

import math

import numpy as np

from sao.rollout import tool_format
from sao.rollout.envs.base import Env, Task
from sao.rollout.envs.registry import register
from sao.rollout.tool_format import ToolCall


@register("number_search")
class NumberSearch(Env):
  """Config: `n` (the range is 1..n), `max_turns` (default: binary search's worst case + 1)."""
  name = "number_search"
  system_prompt = "Find the hidden number. Call compare with a guess; it says higher, lower or equal."
  tool_schemas = [
      tool_format.function_tool("compare", "Compare a guess with the hidden number.",
                                {"guess": {"type": "integer", "description": "your guess"}}),
  ]

  def __init__(self, n: int = 64, max_turns: int | None = None):
    super().__init__()
    if n < 1:
      raise ValueError(f"n: must be >= 1, got {n}")
    self.n = int(n)
    self.config_max_turns = int(max_turns) if max_turns is not None else math.ceil(math.log2(n + 1)) + 1
    if self.config_max_turns < 1:
      raise ValueError(f"max_turns: must be >= 1, got {max_turns}")
    self._lo = self._hi = self._target = self._range = 0
    self._found = False

  def task_pool(self) -> list[Task]:
    return [{"env": self.name, "key": f"number_search/n{self.n}/t{target}", "n": self.n,
             "max_turns": self.config_max_turns, "target": target} for target in range(1, self.n + 1)]

  def _reset(self, task: Task) -> str:
    self._target = int(task["target"])
    n = int(task["n"])
    if not 1 <= self._target <= n:
      raise ValueError(f"task['target']: {self._target} outside 1..{n}")
    self._range = n
    # The expert's knowledge state: the interval still consistent with the observations so far.
    self._lo, self._hi = 1, n
    self._found = False
    return f"Find the number in 1..{n}."

  def _step(self, call: ToolCall) -> tuple[str, bool]:
    guess = call.arguments["guess"]
    if not 1 <= guess <= self._range:
      return f"error: guess must be in 1..{self._range}", False
    if guess < self._target:
      self._lo = max(self._lo, guess + 1)
      return "higher", False
    if guess > self._target:
      self._hi = min(self._hi, guess - 1)
      return "lower", False
    self._found = True
    return "equal", True

  def score(self) -> float:
    return 1.0 if self._found else 0.0

  def expert_action(self) -> ToolCall:
    return ToolCall("compare", {"guess": (self._lo + self._hi) // 2})

  def noisy_action(self, rng: np.random.Generator) -> ToolCall:
    # A guess anywhere in the whole range: may repeat what is already known, i.e. waste a turn.
    return ToolCall("compare", {"guess": int(rng.integers(1, self._range + 1))})
