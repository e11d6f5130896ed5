"""number_search: find a hidden integer in a range of N consecutive integers by asking `compare(guess)`.

The range is `offset+1 .. offset+N`, for every N in `sizes` (default: just `n`) and offset in `offsets` (default
`(0,)`): a configuration can hold many distinct tasks, and its validation/test splits many held-out ones.

The observation starts with one word: "higher" (the hidden number is higher than the guess), "lower", or "equal"
(found; the episode ends). With `show_interval`, "higher"/"lower" are followed by the interval still consistent with
every answer so far (`"higher 9..16"`): the environment's state is then in the last observation (a Markov
observation), which a tiny toy policy and its critic can read without re-deriving it from the whole history.
Reward 1 iff found within `max_turns` calls. The optimal policy is binary search, which needs at most
ceil(log2(N + 1)) calls, so the default budget (8 for N = 64) leaves one spare turn.
"""
from __future__ import annotations

import math

import numpy as np

from sao.rollout import tool_format
from sao.rollout.envs.base import SPLIT_FRACTIONS, Env, Task, check_split_fractions
from sao.rollout.envs.registry import register
from sao.rollout.tool_format import ToolCall


SPLIT_BY = ("target", "range")


def range_key(size: int, offset: int) -> str:
  """The key of the range offset+1..offset+size: the prefix of its tasks' keys."""
  return f"number_search/n{size}" if offset == 0 else f"number_search/n{size}/o{offset}"


@register("number_search")
class NumberSearch(Env):
  """Config: `n` (range size), `sizes` (several range sizes instead of `n`), `max_turns` (default: binary search's
  worst case + `spare_turns` (default 1), per size), `offsets` (each gives the ranges offset+1..offset+size; default
  (0,)), `show_interval` (observations carry the remaining interval), `split_fractions` (train, validation, test shares
  of the task keys; default `base.SPLIT_FRACTIONS`: a small pool holds out more so that its validation set is not a
  handful of targets), `split_by` ("target": each task's key decides its split; "range": the range's key
  `number_search/n{size}[/o{offset}]` does, so a held-out range holds out all of its targets).

  Why "range": the policy never sees the target, only the range and the answers. Holding out targets of ranges it
  trains on makes the training distribution over targets differ from validation's on the same prompts, and the best
  policy for the training targets is then not binary search but a search biased towards them (RL finds that, and
  validation pays for it). Holding out whole ranges keeps every training range's targets uniform, so binary search is
  optimal on training and held-out tasks alike, and validation measures whether the rule carries over to unseen
  ranges."""
  name = "number_search"
  runs_inline = True  # pure arithmetic: the agent loop calls it on its event loop (`agent.runs_inline`)
  system_prompt = "Find the hidden number. Call compare with a guess; it says higher, lower or equal."
  tool_schemas = [
      tool_format.function_tool("compare", "Compare a guess with the hidden number.",
                                {"guess": {"type": "integer", "description": "your guess"}}),
  ]

  def __init__(self, n: int = 64, max_turns: int | None = None, offsets: tuple[int, ...] = (0,),
               show_interval: bool = False, sizes: tuple[int, ...] | None = None, spare_turns: int = 1,
               split_fractions: tuple[float, float, float] | None = None, split_by: str = "target"):
    super().__init__()
    if split_by not in SPLIT_BY:
      raise ValueError(f"split_by: {split_by!r} is not one of {SPLIT_BY}")
    self.split_by = split_by
    self.split_fractions = check_split_fractions(SPLIT_FRACTIONS if split_fractions is None else split_fractions)
    sizes = (n,) if sizes is None else tuple(int(s) for s in sizes)
    offsets = tuple(int(o) for o in offsets)
    if not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes):
      raise ValueError(f"n/sizes: need distinct range sizes >= 1, got {sizes}")
    if not offsets or min(offsets) < 0 or len(set(offsets)) != len(offsets):
      raise ValueError(f"offsets: need distinct integers >= 0, got {offsets}")
    if max_turns is not None and int(max_turns) < 1:
      raise ValueError(f"max_turns: must be >= 1, got {max_turns}")
    if spare_turns < 0:
      raise ValueError(f"spare_turns: must be >= 0, got {spare_turns}")
    self.spare_turns = int(spare_turns)
    self.n = max(sizes)
    self.sizes = sizes
    self.offsets = offsets
    self.show_interval = bool(show_interval)
    self._max_turns_arg = max_turns
    self.config_max_turns = self.turn_budget(self.n)
    self._lo = self._hi = self._target = self._first = self._last = 0
    self._show_interval = False
    self._found = False

  def turn_budget(self, size: int) -> int:
    """The configured `max_turns`, or binary search's worst case on `size` numbers + `spare_turns`."""
    if self._max_turns_arg is not None:
      return int(self._max_turns_arg)
    return math.ceil(math.log2(size + 1)) + self.spare_turns

  def task_pool(self) -> list[Task]:
    pool = []
    for size in self.sizes:
      for offset in self.offsets:
        for target in range(offset + 1, offset + size + 1):
          # The plain range keeps its original keys (and so its split); offset ranges are new, distinct tasks.
          key = f"{range_key(size, offset)}/t{target}"
          task = {"env": self.name, "key": key, "n": size, "max_turns": self.turn_budget(size), "target": target}
          if offset:
            task["offset"] = offset
          if self.show_interval:
            task["show_interval"] = True
          pool.append(task)
    return pool

  def split_key(self, task: Task) -> str:
    if self.split_by == "target":
      return super().split_key(task)
    return range_key(int(task["n"]), int(task.get("offset", 0)))

  def _reset(self, task: Task) -> str:
    self._target = int(task["target"])
    n, offset = int(task["n"]), int(task.get("offset", 0))
    self._first, self._last = offset + 1, offset + n
    if not self._first <= self._target <= self._last:
      raise ValueError(f"task['target']: {self._target} outside {self._first}..{self._last}")
    self._show_interval = bool(task.get("show_interval", False))
    # The expert's knowledge state: the interval still consistent with the observations so far.
    self._lo, self._hi = self._first, self._last
    self._found = False
    return f"Find the number in {self._first}..{self._last}."

  def _step(self, call: ToolCall) -> tuple[str, bool]:
    guess = call.arguments["guess"]
    if not self._first <= guess <= self._last:
      return f"error: guess must be in {self._first}..{self._last}", False
    if guess == self._target:
      self._found = True
      return "equal", True
    if guess < self._target:
      self._lo = max(self._lo, guess + 1)
      word = "higher"
    else:
      self._hi = min(self._hi, guess - 1)
      word = "lower"
    return f"{word} {self._lo}..{self._hi}" if self._show_interval else word, False

  def score(self) -> float:
    return 1.0 if self._found else 0.0

  def expert_action(self) -> ToolCall:
    return ToolCall("compare", {"guess": (self._lo + self._hi) // 2})

  def noisy_action(self, rng: np.random.Generator) -> ToolCall:
    # A guess anywhere in the whole range: may repeat what is already known, i.e. waste a turn.
    return ToolCall("compare", {"guess": int(rng.integers(self._first, self._last + 1))})
