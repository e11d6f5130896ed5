"""search_chain: find `rounds` hidden numbers one after another with one shared turn budget; a sparse outcome reward.

A task is a *plan* — the range sizes of its rounds, e.g. (9, 14, 8, 12) — and one hidden target per round. Round i's
number lies in 1..n_i; the agent asks `compare(guess)` (number_search's tool) and is told "higher", "lower" or
"equal". On "equal" the next round starts; the episode ends when the last number is found (reward 1) or the budget
`max_turns` = Σ_i ceil(log2(n_i + 1)) + `spare_turns` is spent (reward 0). Nothing is paid for a round on its own:
the reward is the outcome of the whole chain, tens of turns after the decisions that decided it.

Every observation says how promising the episode still is. Besides the interval still consistent with this round's
answers (a Markov state, as number_search's `show_interval`), it carries the **slack** — the turns left minus binary
search's worst case for what remains (this round's interval, then every later round):

    higher 6..9 +1      # within a round: this round's interval, then the slack (signed)
    equal 1..12 +1      # a round is done: the next round's range, then the slack
    equal               # the last number: the episode ends with reward 1

Binary search from a state with slack ≥ 0 always succeeds; each guess that does not shrink the interval's worst case
(a repeated, out-of-interval or badly placed guess) costs one slack; below 0 only lucky guesses can still finish. So
the value of a state is (almost) a function of the slack and the rounds left, which a learned critic can read off the
last observation, while the outcome reward comes only at the end: a critic that has learned it assigns each turn's
credit where it happened (the slack it cost), a broken one leaves the actor with one sparse, delayed outcome for
tens of decisions.

**A first round of its own** (`first_sizes`): the first round's range sizes can differ from the later rounds' (e.g.
40..55 against 8..15), so its guesses are numbers the later rounds never ask for — a skill the outcome, a dozen
turns later, has to teach on its own, which needs credit from the values in between.

Splits hold out whole plans (`split_key` is the plan): validation and test episodes are sequences of ranges the policy
never trained on, while every range size occurs in training, with uniformly drawn targets (so binary search stays
optimal everywhere; cf. number_search's `split_by="range"`).
"""
from __future__ import annotations

import hashlib
import itertools
import math

import numpy as np

from sao.rollout import tool_format
from sao.rollout.envs.base import Env, Task, check_split_fractions
from sao.rollout.envs.registry import register
from sao.rollout.tool_format import ToolCall

# Held-out plans: 60 / 20 / 20 % of them (the default pool is 4,096 plans, so validation is hundreds of plans).
CHAIN_SPLIT_FRACTIONS = (0.6, 0.2, 0.2)


def worst_case_turns(size: int) -> int:
  """Binary search's worst case on `size` consecutive integers: ceil(log2(size + 1)) guesses (0 for size 0)."""
  if size < 0:
    raise ValueError(f"size: must be >= 0, got {size}")
  return math.ceil(math.log2(size + 1))


def plan_key(plan: tuple[int, ...]) -> str:
  """The key of a plan (its rounds' range sizes): the prefix of its tasks' keys, and what decides their split."""
  return "search_chain/n" + "-".join(str(n) for n in plan)


@register("search_chain")
class SearchChain(Env):
  """Config: `sizes` (the range sizes a round may have), `rounds` (rounds per episode), `spare_turns` (budget beyond
  binary search's worst case), `targets_per_plan` (hidden-target tuples per plan in the task pool),
  `split_fractions` (train, validation, test shares of the plans; default `CHAIN_SPLIT_FRACTIONS`), `first_sizes`
  (the first round's range sizes; default: `sizes`).

  The plan pool is every sequence of a first size from `first_sizes`, then `rounds` − 1 sizes from `sizes`; each
  plan's targets are drawn from a generator seeded by its key, so the pool is the same in every process."""
  name = "search_chain"
  runs_inline = True  # pure arithmetic (`agent.runs_inline`)
  # number_search's prompt (one toy-vocabulary piece): each round is a number search; the user turn says the rest.
  system_prompt = "Find the hidden number. Call compare with a guess; it says higher, lower or equal."
  tool_schemas = [
      tool_format.function_tool("compare", "Compare a guess with the hidden number.",
                                {"guess": {"type": "integer", "description": "your guess"}}),
  ]

  def __init__(self, sizes: tuple[int, ...] = tuple(range(8, 16)), rounds: int = 4, spare_turns: int = 2,
               targets_per_plan: int = 1, split_fractions: tuple[float, float, float] | None = None,
               first_sizes: tuple[int, ...] = ()):
    super().__init__()
    sizes = tuple(int(s) for s in sizes)
    if not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes):
      raise ValueError(f"sizes: need distinct range sizes >= 1, got {sizes}")
    first_sizes = tuple(int(s) for s in first_sizes) or sizes
    if min(first_sizes) < 1 or len(set(first_sizes)) != len(first_sizes):
      raise ValueError(f"first_sizes: need distinct range sizes >= 1, got {first_sizes}")
    if int(rounds) < 1:
      raise ValueError(f"rounds: must be >= 1, got {rounds}")
    if int(spare_turns) < 0:
      raise ValueError(f"spare_turns: must be >= 0, got {spare_turns}")
    if int(targets_per_plan) < 1:
      raise ValueError(f"targets_per_plan: must be >= 1, got {targets_per_plan}")
    self.sizes = sizes
    self.first_sizes = first_sizes
    self.rounds = int(rounds)
    self.spare_turns = int(spare_turns)
    self.targets_per_plan = int(targets_per_plan)
    self.split_fractions = check_split_fractions(CHAIN_SPLIT_FRACTIONS if split_fractions is None
                                                 else split_fractions)
    self._pool: list[Task] | None = None  # built on first use (thousands of tasks), then shared
    self._plan: tuple[int, ...] = ()
    self._targets: tuple[int, ...] = ()
    self._round = self._lo = self._hi = 0
    self._found_all = False

  # ----------------------------------------------------------------------------------------------------------------
  # Tasks.

  def turn_budget(self, plan: tuple[int, ...]) -> int:
    return sum(worst_case_turns(n) for n in plan) + self.spare_turns

  def task_pool(self) -> list[Task]:
    if self._pool is None:
      self._pool = self._build_pool()
    return [dict(task) for task in self._pool]

  def _build_pool(self) -> list[Task]:
    pool = []
    for plan in itertools.product(self.first_sizes, *[self.sizes] * (self.rounds - 1)):
      key = plan_key(plan)
      seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
      rng = np.random.default_rng(seed)
      drawn = set()
      for _ in range(self.targets_per_plan):
        targets = tuple(int(rng.integers(1, n + 1)) for n in plan)
        if targets in drawn:
          continue  # a small plan space may repeat a draw; keys stay unique
        drawn.add(targets)
        pool.append({"env": self.name, "key": f"{key}/t" + "-".join(str(t) for t in targets),
                     "plan": list(plan), "targets": list(targets), "max_turns": self.turn_budget(plan)})
    return pool

  def split_key(self, task: Task) -> str:
    return plan_key(tuple(int(n) for n in task["plan"]))

  # ----------------------------------------------------------------------------------------------------------------
  # Episode.

  def slack(self) -> int:
    """(Called after `Env.step` has counted the turn being answered.) Turns left minus binary search's worst case for the rest of the episode (this round's interval, then the
    later rounds); ≥ 0 means binary search from here always succeeds."""
    needed = worst_case_turns(self._hi - self._lo + 1) + sum(worst_case_turns(n) for n in self._plan[self._round + 1:])
    return (self.max_turns - self.turns) - needed

  def _reset(self, task: Task) -> str:
    plan = tuple(int(n) for n in task["plan"])
    targets = tuple(int(t) for t in task["targets"])
    if not plan or len(plan) != len(targets):
      raise ValueError(f"task: plan {plan} and targets {targets} must be non-empty and of one length")
    for n, t in zip(plan, targets):
      if not 1 <= t <= n:
        raise ValueError(f"task['targets']: {t} outside 1..{n}")
    self._plan, self._targets = plan, targets
    self._round, self._lo, self._hi = 0, 1, plan[0]
    self._found_all = False
    return f"Find the number in 1..{plan[0]}. {len(plan)} numbers, {int(task['max_turns'])} turns."

  def _step(self, call: ToolCall) -> tuple[str, bool]:
    guess = call.arguments["guess"]
    size = self._plan[self._round]
    target = self._targets[self._round]
    if not 1 <= guess <= size:
      return f"error: guess must be in 1..{size} {self.slack():+d}", False
    if guess == target:
      self._round += 1
      if self._round == len(self._plan):
        self._found_all = True
        return "equal", True
      self._lo, self._hi = 1, self._plan[self._round]
      return f"equal 1..{self._hi} {self.slack():+d}", False
    if guess < target:
      self._lo = max(self._lo, guess + 1)
      word = "higher"
    else:
      self._hi = min(self._hi, guess - 1)
      word = "lower"
    return f"{word} {self._lo}..{self._hi} {self.slack():+d}", False

  def score(self) -> float:
    return 1.0 if self._found_all else 0.0

  # ----------------------------------------------------------------------------------------------------------------
  # Scripted expert.

  def expert_action(self) -> ToolCall:
    return ToolCall("compare", {"guess": (self._lo + self._hi) // 2})

  def noisy_action(self, rng: np.random.Generator) -> ToolCall:
    # A guess anywhere in this round's range: often outside the interval still possible, i.e. a wasted turn.
    return ToolCall("compare", {"guess": int(rng.integers(1, self._plan[self._round] + 1))})
