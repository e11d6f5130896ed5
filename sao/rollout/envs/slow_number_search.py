"""slow_number_search: number_search whose episodes take an extra, heavy-tailed amount of wall-clock time.

Real agent tasks (SWE containers, test suites) have heavy-tailed episode durations; this toy reproduces that on a
laptop so pipeline benchmarks (`experiments/bench/bench_pipeline.py`) can compare a fully asynchronous trainer with a
synchronous one. The rules and rewards are exactly `number_search`'s; `reset` additionally sleeps once per episode
for `scale * X` seconds with X ~ Pareto(`delay_pareto_alpha`) (support [1, inf)), capped at `delay_max_s`. With
alpha <= 2 the variance is infinite: a few episodes take far longer than the median.

The delay settings travel in the task (tasks are self-describing), so workers need no extra configuration. Scripted
demonstrations (`demonstrate`) never sleep: they feed the supervised warm start, not the pipeline under test.
"""
from __future__ import annotations

import time

import numpy as np

from sao.rollout.envs.base import Demonstration, Task
from sao.rollout.envs.number_search import NumberSearch
from sao.rollout.envs.registry import register


def pareto_delay(rng: np.random.Generator, alpha: float, scale_s: float, max_s: float) -> float:
  """One draw of `scale_s * X`, X ~ Pareto(alpha) on [1, inf), capped at `max_s` seconds."""
  return float(min(scale_s * (1.0 + rng.pareto(alpha)), max_s))


@register("slow_number_search")
class SlowNumberSearch(NumberSearch):
  """Config: `n`, `max_turns` (as number_search), `delay_pareto_alpha` (tail index; smaller = heavier tail),
  `delay_scale_s` (the minimum delay, also Pareto's scale), `delay_max_s` (cap), `seed` (None = fresh entropy per
  instance, so concurrent episodes draw independent delays)."""
  name = "slow_number_search"

  def __init__(self, n: int = 64, max_turns: int | None = None, delay_pareto_alpha: float = 1.5,
               delay_scale_s: float = 0.1, delay_max_s: float = 30.0, seed: int | None = None):
    super().__init__(n=n, max_turns=max_turns)
    if delay_pareto_alpha <= 0:
      raise ValueError(f"delay_pareto_alpha: must be > 0, got {delay_pareto_alpha}")
    if delay_scale_s < 0 or delay_max_s < 0:
      raise ValueError(f"delay_scale_s, delay_max_s: must be >= 0, got {delay_scale_s}, {delay_max_s}")
    self.delay_pareto_alpha = float(delay_pareto_alpha)
    self.delay_scale_s = float(delay_scale_s)
    self.delay_max_s = float(delay_max_s)
    self._rng = np.random.default_rng(seed)
    self._demonstrating = False
    self.last_delay_s = 0.0

  def task_pool(self) -> list[Task]:
    # Same keys as number_search (so the same split), plus the delay distribution the episode must use.
    return [{**t, "delay_pareto_alpha": self.delay_pareto_alpha, "delay_scale_s": self.delay_scale_s,
             "delay_max_s": self.delay_max_s} for t in super().task_pool()]

  def _reset(self, task: Task) -> str:
    first = super()._reset(task)
    self.last_delay_s = 0.0
    if not self._demonstrating:
      self.last_delay_s = pareto_delay(
          self._rng, float(task.get("delay_pareto_alpha", self.delay_pareto_alpha)),
          float(task.get("delay_scale_s", self.delay_scale_s)), float(task.get("delay_max_s", self.delay_max_s)))
      time.sleep(self.last_delay_s)  # the agent loop runs env calls in a thread: this blocks one episode only
    return first

  def demonstrate(self, task: Task, rng: np.random.Generator, noise: float = 0.0) -> Demonstration:
    self._demonstrating = True
    try:
      return super().demonstrate(task, rng, noise)
    finally:
      self._demonstrating = False
