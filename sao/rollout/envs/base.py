"""The environment interface every toy/real task family implements, and the split rule they share.

An `Env` is one episode's state machine:

    messages = env.reset(task)                 # [system, user]
    while not done:
      observation, done = env.step(call)       # or env.step_text(assistant_text)
    reward = env.score()

Tasks are plain JSON-serialisable dicts (they travel to rollout workers as `LeasedTask.task_json`) and are
self-describing: `reset` reads the episode's settings (turn budget, sizes) from the task, so any instance of the
environment can run any of its tasks. Every task carries `env`, `task_id` and `key`; `key` identifies the task's
content and alone decides its split (`split_of`), so train / validation / test never share a task whatever the seed.
"""
from __future__ import annotations

import abc
import dataclasses
import hashlib
from typing import Any, ClassVar

import numpy as np

from sao.rollout import tool_format
from sao.rollout.tool_format import ToolCall, ToolCallError

Message = dict[str, str]  # {"role": "system" | "user" | "assistant" | "tool", "content": ...}
Task = dict[str, Any]

SPLITS = ("train", "validation", "test")
# Fractions of task keys per split; fixed so that a key's split never changes between runs or configs.
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)


def check_split_fractions(fractions) -> tuple[float, float, float]:
  """`fractions` as 3 floats (train, validation, test), each > 0, summing to 1; ValueError naming the problem."""
  values = tuple(float(f) for f in fractions)
  if len(values) != len(SPLITS) or min(values) <= 0 or abs(sum(values) - 1.0) > 1e-6:
    raise ValueError(f"split_fractions: need {len(SPLITS)} positive fractions (train, validation, test) summing to 1, "
                     f"got {tuple(fractions)}")
  return values  # type: ignore[return-value]


def split_of(key: str, fractions: tuple[float, float, float] = SPLIT_FRACTIONS) -> str:
  """The split a task key belongs to: a stable hash (not Python's salted `hash`) mapped to [0, 1), cut at the
  cumulative `fractions` (train, validation, test)."""
  u = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2.0**64
  edge = 0.0
  for split, fraction in zip(SPLITS, fractions):
    edge += fraction
    if u < edge:
      return split
  return SPLITS[-1]


@dataclasses.dataclass
class Demonstration:
  """An expert episode: the calls made, the full transcript (first messages, then assistant/tool pairs), the reward."""
  task: Task
  calls: list[ToolCall]
  messages: list[Message]
  reward: float


class Env(abc.ABC):
  """Base class: turn budget, tool-call checking and the task sampler; subclasses supply the rules.

  Subclasses define `name`, `system_prompt`, `tool_schemas`, and implement `task_pool`, `_reset`, `_step`, `score`,
  `expert_action`, and `noisy_action`.
  """
  name: ClassVar[str]
  system_prompt: ClassVar[str]
  tool_schemas: ClassVar[list[dict[str, Any]]]
  split_fractions: tuple[float, float, float] = SPLIT_FRACTIONS  # an env may hold out more (`check_split_fractions`)
  # True: reset/step/score are pure, microsecond-scale Python, and the agent loop calls them on its event loop
  # instead of a thread. Read from the class that sets it only (`sao.rollout.agent.runs_inline`): a subclass that
  # sleeps or runs commands in its hooks is threaded again unless it declares this itself.
  runs_inline: ClassVar[bool] = False

  def __init__(self):
    self.task: Task | None = None
    self.turns = 0
    self.max_turns = 0
    self.done = True

  # ----------------------------------------------------------------------------------------------------------------
  # Tasks.

  @abc.abstractmethod
  def task_pool(self) -> list[Task]:
    """Every distinct task of this configuration, in a fixed order, each with a unique `key` (all splits)."""

  def tasks(self, split: str, n: int, seed: int) -> list[Task]:
    """`n` tasks of `split`, deterministic given `seed`.

    Distinct tasks first (in a seeded order); when `n` exceeds the split's pool the pool is cycled and repeats get
    task ids `key#1`, `key#2`, ... so task ids stay unique within the list.
    """
    if split not in SPLITS:
      raise ValueError(f"split: {split!r} is not one of {SPLITS}")
    pool = self.split_pool(split)
    if not pool:
      raise ValueError(f"split: {self.name} has no {split!r} tasks in this configuration")
    order = np.random.default_rng(seed).permutation(len(pool))
    out = []
    for i in range(n):
      task = dict(pool[order[i % len(pool)]])
      repeat = i // len(pool)
      task["task_id"] = task["key"] if repeat == 0 else f"{task['key']}#{repeat}"
      out.append(task)
    return out

  def split_pool(self, split: str) -> list[Task]:
    """Every task of `split` in `task_pool` order: those with `split_of(self.split_key(task), self.split_fractions)
    == split`."""
    return [t for t in self.task_pool() if split_of(self.split_key(t), self.split_fractions) == split]

  def split_key(self, task: Task) -> str:
    """What decides `task`'s split: its key (tasks that share a split key always share a split)."""
    return task["key"]

  # ----------------------------------------------------------------------------------------------------------------
  # Episode.

  def reset(self, task: Task) -> list[Message]:
    """Starts an episode of `task`; returns the first messages (system prompt, then the user's request)."""
    if task.get("env") != self.name:
      raise ValueError(f"task['env']: {task.get('env')!r} is not a {self.name!r} task")
    self.task = task
    self.turns = 0
    self.max_turns = int(task["max_turns"])
    self.done = False
    user = self._reset(task)
    return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": user}]

  def step(self, call: ToolCall | ToolCallError) -> tuple[str, bool]:
    """Runs one tool call; returns (observation, done). Every call, even a malformed one, uses a turn.

    A `ToolCallError`, an unknown tool or bad arguments give an "error: ..." observation, never an exception, so a
    babbling policy cannot crash the rollout (and, since errors use turns, cannot loop forever).
    """
    if self.done:
      raise RuntimeError(f"{self.name}: step() after the episode ended (turns={self.turns}); call reset()")
    self.turns += 1
    if isinstance(call, ToolCallError):
      observation = call.observation
    else:
      problem = self._check_call(call)
      if problem is not None:
        observation = f"error: {problem}"
      else:
        observation, self.done = self._step(call)
    if self.turns >= self.max_turns:
      self.done = True
    return observation, self.done

  def step_text(self, assistant_text: str) -> tuple[str, bool]:
    """Parses the assistant turn's tool call (see `tool_format`) and steps."""
    return self.step(tool_format.parse_tool_call(assistant_text, self.tool_schemas))

  def _check_call(self, call: ToolCall) -> str | None:
    schema = next((t for t in self.tool_schemas if t["function"]["name"] == call.name), None)
    if schema is None:
      return f"unknown tool {call.name!r}"
    return tool_format.check_arguments(schema, call.arguments)

  @abc.abstractmethod
  def _reset(self, task: Task) -> str:
    """Sets up the episode's state; returns the first user message."""

  @abc.abstractmethod
  def _step(self, call: ToolCall) -> tuple[str, bool]:
    """Runs a well-formed call of a known tool; returns (observation, done)."""

  @abc.abstractmethod
  def score(self) -> float:
    """The episode's outcome reward (1 success, 0 failure); meaningful once `done`."""

  # ----------------------------------------------------------------------------------------------------------------
  # Scripted expert.

  @abc.abstractmethod
  def expert_action(self) -> ToolCall:
    """The optimal next call in the current state."""

  @abc.abstractmethod
  def noisy_action(self, rng: np.random.Generator) -> ToolCall:
    """A random, usually suboptimal, call in the current state."""

  def demonstrate(self, task: Task, rng: np.random.Generator, noise: float = 0.0) -> Demonstration:
    """Plays `task` with the scripted expert; with probability `noise` per turn it takes `noisy_action` instead.

    Resets this environment (its current episode is lost).
    """
    if not 0.0 <= noise <= 1.0:
      raise ValueError(f"noise: must be in [0, 1], got {noise}")
    messages = self.reset(task)
    calls = []
    done = False
    while not done:
      call = self.noisy_action(rng) if noise and rng.random() < noise else self.expert_action()
      observation, done = self.step(call)
      calls.append(call)
      messages.append({"role": "assistant", "content": tool_format.format_tool_call(call)})
      messages.append({"role": "tool", "content": observation})
    return Demonstration(task=task, calls=calls, messages=messages, reward=self.score())
