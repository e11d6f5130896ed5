"""A bounded pool of concurrent SWE episodes: at most `max_concurrent` sandboxes exist at once, and every episode's
directories are removed when it ends — normally, by an exception, or by cancellation.

    pool = EpisodePool(max_concurrent=8, env_factory=lambda: SweEnv())
    results = await pool.map(tasks, expert_policy)     # EpisodeResult per task, in task order

A policy is `async def policy(env, task) -> None` that plays one episode to its end through `env.areset` /
`env.astep` (the scaffolds drive models this way; `expert_policy` plays the scripted expert).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Awaitable, Callable, Sequence

from sao.rollout.envs.swe.env import GradeVoidError, SweEnv
from sao.rollout.envs.swe.sandbox import SandboxError
from sao.transport.trajectory import Status

log = logging.getLogger(__name__)

Policy = Callable[[SweEnv, dict], Awaitable[None]]


@dataclasses.dataclass(frozen=True)
class EpisodeResult:
  """How one episode ended: the trajectory status the trainer would see, the reward, turns and time."""
  task_id: str
  status: Status
  reward: float
  turns: int
  duration_s: float
  error: str = ""


async def expert_policy(env: SweEnv, task: dict) -> None:
  """Plays `task` with the environment's scripted expert."""
  await env.areset(task)
  done = False
  while not done:
    _, done = await env.astep(env.expert_action())


class EpisodePool:
  """Runs episodes with at most `max_concurrent` live sandboxes (episode + grading share one slot)."""

  def __init__(self, max_concurrent: int, env_factory: Callable[[], SweEnv]):
    if max_concurrent < 1:
      raise ValueError(f"max_concurrent: must be >= 1, got {max_concurrent}")
    self.max_concurrent = max_concurrent
    self.env_factory = env_factory
    self._gate = asyncio.Semaphore(max_concurrent)
    self.active = 0
    self.peak_active = 0  # the most episodes that ran at once (tests check the bound)

  async def run(self, task: dict, policy: Policy = expert_policy) -> EpisodeResult:
    """One episode of `task` under `policy`. Environment failures become statuses; cancellation propagates after
    the episode's directories are removed."""
    async with self._gate:
      self.active += 1
      self.peak_active = max(self.peak_active, self.active)
      env = self.env_factory()
      start = time.monotonic()
      status, reward, error = Status.OK, 0.0, ""
      try:
        await policy(env, task)
        reward = await env.ascore()
      except GradeVoidError as e:
        status, error = e.result.status, str(e)
      except (TimeoutError, asyncio.TimeoutError) as e:
        status, error = Status.TIMEOUT, f"{type(e).__name__}: {e}"
      except SandboxError as e:
        status, error = Status.ENV_ERROR, str(e)
        log.warning("task %s: sandbox failed: %s", task.get("task_id"), e)
      finally:
        self.active -= 1
        await env.aclose()
      return EpisodeResult(task_id=str(task.get("task_id", task.get("key", ""))), status=status, reward=reward,
                           turns=env.turns, duration_s=time.monotonic() - start, error=error)

  async def map(self, tasks: Sequence[dict], policy: Policy = expert_policy) -> list[EpisodeResult]:
    """`run` for every task, concurrently within the bound; results in task order."""
    return list(await asyncio.gather(*(self.run(t, policy) for t in tasks)))
