"""Bounded concurrent episodes: the expert on the validation split with 8 sandboxes at once, and cleanup of every
episode directory — after normal ends, failures and cancellation."""
from __future__ import annotations

import asyncio
import os

import pytest

from sao.rollout.envs.swe import SweEnv
from sao.rollout.envs.swe.pool import EpisodePool, expert_policy
from sao.rollout.tool_format import ToolCall
from sao.transport.trajectory import Status


def test_expert_solves_validation_with_8_concurrent_sandboxes(tmp_path):
  """Every validation repository of the generated dataset, played by the scripted expert, 8 sandboxes at a time."""
  env = SweEnv(sandbox_root=str(tmp_path))
  tasks = env.split_pool("validation")
  assert len(tasks) >= 15
  pool = EpisodePool(8, lambda: SweEnv(sandbox_root=str(tmp_path)))
  results = asyncio.run(pool.map([dict(t, task_id=t["key"]) for t in tasks]))
  solved = sum(r.status == Status.OK and r.reward == 1.0 for r in results)
  assert solved / len(results) >= 0.95, [r for r in results if r.reward != 1.0]
  assert pool.peak_active == 8
  assert os.listdir(tmp_path) == []  # every episode's and every grading's directory is gone


def test_failures_and_cancellation_clean_up(tmp_path, calc_dataset):
  jsonl, root, _ = calc_dataset
  make = lambda: SweEnv(jsonl=str(jsonl), snapshot_root=str(root), sandbox_root=str(tmp_path), command_timeout_s=60)
  task = make().task_pool()[0]
  started = asyncio.Event()

  async def failing(env, task):
    await env.areset(task)
    raise RuntimeError("policy bug")

  async def slow(env, task):
    await env.areset(task)
    started.set()
    await env.astep(ToolCall("bash", {"command": "sleep 61"}))

  async def main():
    pool = EpisodePool(4, make)
    with pytest.raises(RuntimeError, match="policy bug"):
      await pool.run(task, failing)
    assert os.listdir(tmp_path) == []
    episodes = asyncio.gather(*(pool.run(task, slow) for _ in range(3)))
    await started.wait()
    await asyncio.sleep(0.5)
    assert len(os.listdir(tmp_path)) >= 1
    episodes.cancel()  # e.g. the worker shuts down mid-episode
    with pytest.raises(asyncio.CancelledError):
      await episodes
    # Cancelling during the (uninterruptible) copy of the repository: closed as soon as the copy finishes.
    reset = asyncio.ensure_future(make().areset(task))
    await asyncio.sleep(0)
    reset.cancel()
    with pytest.raises(asyncio.CancelledError):
      await reset
    for _ in range(100):
      if not os.listdir(tmp_path):
        break
      await asyncio.sleep(0.05)

  asyncio.run(asyncio.wait_for(main(), 60))
  assert os.listdir(tmp_path) == []
  assert os.popen("pgrep -f 'sleep 6[1]'").read().strip() == ""  # the cancelled commands were killed


def test_expert_policy_demonstrations_match_env_demonstrate(calc_dataset):
  jsonl, root, _ = calc_dataset
  env = SweEnv(jsonl=str(jsonl), snapshot_root=str(root))
  task = env.task_pool()[0]
  asyncio.run(expert_policy(env, task))
  assert env.done and asyncio.run(env.ascore()) == 1.0
  env.close()
