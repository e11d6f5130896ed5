"""Environments that declare `runs_inline` are called on the agent loop's thread; every other one (a subclass that
does not declare it itself included) in a worker thread. The trajectory is the same either way."""
from __future__ import annotations

import asyncio
import re
import threading

from sao.engines.sglang_client import GenerateResult
from sao.models.sampling import SamplingParams
from sao.models.tokenizer import toy_tokenizer
from sao.rollout import agent, envs

TOKENIZER = toy_tokenizer()


class BisectingEngine:
  """Answers every turn with the midpoint of the interval in the last observation (an instant, scripted policy)."""

  async def generate(self, input_ids, sampling_params):
    found = re.findall(r"(\d+)\.\.(\d+)", TOKENIZER.decode(input_ids))
    lo, hi = (int(found[-1][0]), int(found[-1][1])) if found else (1, 16)
    text = f'<tool_call>{{"name": "compare", "arguments": {{"guess": {(lo + hi) // 2}}}}}</tool_call>'
    ids = TOKENIZER.encode(text) + [TOKENIZER.eos_token_ids[0]]
    return GenerateResult(token_ids=tuple(ids), logprobs=(-0.5,) * len(ids), finish_reason="stop",
                          weight_version="3")


class ThreadRecordingSearch(envs.NumberSearch):
  """number_search recording the thread of each reset/step/score; inherits `runs_inline` without declaring it."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.threads: list[int] = []

  def reset(self, task):
    self.threads.append(threading.get_ident())
    return super().reset(task)

  def step(self, call):
    self.threads.append(threading.get_ident())
    return super().step(call)

  def score(self):
    self.threads.append(threading.get_ident())
    return super().score()


class InlineRecordingSearch(ThreadRecordingSearch):
  runs_inline = True


def _play(env):
  task = env.tasks("train", 1, seed=3)[0]

  async def main():
    traj = await agent.run_episode(BisectingEngine(), TOKENIZER, env, task, SamplingParams(max_new_tokens=32),
                                   agent.EpisodeLimits(max_turns=8, max_total_tokens=400))
    return traj, threading.get_ident()

  return asyncio.run(main())


def test_inline_envs_run_on_the_loop_thread_and_others_in_threads():
  assert agent.runs_inline(envs.make("number_search", n=16))
  assert not agent.runs_inline(ThreadRecordingSearch(n=16))  # not its own declaration: threaded
  assert not agent.runs_inline(envs.make("slow_number_search", n=16))
  threaded, inline = ThreadRecordingSearch(n=16, show_interval=True), InlineRecordingSearch(n=16, show_interval=True)
  traj_threaded, loop_thread = _play(threaded)
  assert threaded.threads and loop_thread not in threaded.threads
  traj_inline, loop_thread = _play(inline)
  assert inline.threads and set(inline.threads) == {loop_thread}
  assert traj_inline.reward == traj_threaded.reward == 1.0 and traj_inline.num_turns >= 1
  for field in ("token_ids", "action_mask", "rollout_logprobs"):
    assert getattr(traj_inline, field).tolist() == getattr(traj_threaded, field).tolist()
  assert traj_inline.turn_boundaries == traj_threaded.turn_boundaries
