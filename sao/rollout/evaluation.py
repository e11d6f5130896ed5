"""Offline evaluation of a policy on every task of an environment's splits, the way the rollout worker plays them.

The trainer's in-run validation samples the validation list every `eval_every` versions; this measures one policy
precisely: every task of each split `samples` times, through the same harness, sampling parameters (including the
tokenizer's stop tokens: without them a policy keeps generating past its turn and is scored lower than it plays)
and episode limits as the worker. `experiments/evaluate.py` is the command.
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Any, Mapping, Sequence

from sao.models.sampling import SamplingParams
from sao.models.tokenizer import Tokenizer
from sao.rollout import agent, envs
from sao.rollout import harnesses as harness_lib


@dataclasses.dataclass(frozen=True)
class SplitResult:
  """One split's success: `successes / episodes`, its binomial standard error, and the mean reward."""
  split: str
  num_tasks: int
  episodes: int
  successes: int
  mean_reward: float
  by_status: dict[str, int]

  @property
  def success_rate(self) -> float:
    return self.successes / self.episodes if self.episodes else float("nan")

  @property
  def stderr(self) -> float:
    p = self.success_rate
    return math.sqrt(p * (1.0 - p) / self.episodes) if self.episodes else float("nan")


def worker_sampling(tokenizer: Tokenizer, max_new_tokens: int, temperature: float, top_p: float = 1.0,
                    top_k: int = 0) -> SamplingParams:
  """The rollout worker's per-turn sampling parameters (`sao.rollout.worker`)."""
  return SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                        stop_token_ids=tuple(tokenizer.eos_token_ids))


async def evaluate_splits(engine: agent.Engine, tokenizer: Tokenizer, env_name: str, env_kwargs: Mapping[str, Any],
                          splits: Sequence[str], samples: int, sampling: SamplingParams, limits: agent.EpisodeLimits,
                          harness: str = "xml_json", concurrency: int = 64,
                          success_threshold: float = 1.0) -> dict[str, SplitResult]:
  """Plays every task of each split `samples` times; {split: SplitResult}. An episode succeeds when its reward is
  at least `success_threshold` (the dispenser's rule for validation)."""
  if samples < 1:
    raise ValueError(f"samples: must be >= 1, got {samples}")
  unknown = [s for s in splits if s not in envs.SPLITS]
  if unknown:
    raise ValueError(f"splits: {unknown} not in {envs.SPLITS}")
  env = envs.make(env_name, **env_kwargs)
  runner = harness_lib.get(harness)
  gate = asyncio.Semaphore(concurrency)

  async def play(task: dict[str, Any], sample_index: int):
    async with gate:
      episode_env = envs.make(env_name, **env_kwargs)
      try:
        return await runner.run_episode(engine, tokenizer, episode_env, task, sampling, limits,
                                        sample_index=sample_index)
      finally:
        if hasattr(episode_env, "close"):
          await asyncio.to_thread(episode_env.close)

  results = {}
  for split in splits:
    pool = env.split_pool(split)
    if not pool:
      raise ValueError(f"splits: {env_name} has no {split!r} tasks in this configuration")
    trajs = await asyncio.gather(*(play(task, i) for i in range(samples) for task in pool))
    status: dict[str, int] = {}
    for t in trajs:
      name = str(getattr(t.status, "value", t.status))
      status[name] = status.get(name, 0) + 1
    results[split] = SplitResult(
        split=split, num_tasks=len(pool), episodes=len(trajs),
        successes=sum(1 for t in trajs if t.reward >= success_threshold),
        mean_reward=sum(t.reward for t in trajs) / len(trajs), by_status=status)
  return results
