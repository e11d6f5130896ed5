"""The agent loop keeps the engine's routed experts (MoE routing replay): each turn's record covers the stream up to
that turn's last token, so the trajectory carries the last turn's, and a record of the wrong length fails the
episode naming the field."""
from __future__ import annotations

import asyncio
import dataclasses

import numpy as np

from sao.models.sampling import SamplingParams
from sao.rollout import agent, envs
from sao.transport.trajectory import Status
from tests.rollout.test_agent_inline_env import TOKENIZER, BisectingEngine

COLUMNS = 4  # layers · top_k of a pretend MoE


class RoutingEngine(BisectingEngine):
  """The bisecting policy, answering with a record whose row t names token t's id (so rows can be checked)."""

  def __init__(self, extra_rows: int = 0):
    self.extra_rows = extra_rows
    self.turns = 0

  async def generate(self, input_ids, sampling_params):
    result = await super().generate(input_ids, sampling_params)
    self.turns += 1
    fed = list(input_ids) + list(result.token_ids)[:-1] + [0] * self.extra_rows
    return dataclasses.replace(result, routed_experts=np.repeat(np.asarray(fed, np.int32)[:, None], COLUMNS, 1))


def _episode(engine):
  env = envs.make("number_search")
  task = env.tasks("train", 1, seed=5)[0]
  return asyncio.run(agent.run_episode(engine, TOKENIZER, env, task, SamplingParams(max_new_tokens=32),
                                       agent.EpisodeLimits(max_turns=8, max_total_tokens=400)))


def test_trajectory_carries_the_last_turns_record():
  engine = RoutingEngine()
  traj = _episode(engine)
  assert traj.status == Status.OK and engine.turns == traj.num_turns >= 2
  last_action = traj.reward_token_index()
  assert traj.routed_experts.shape == (last_action, COLUMNS)  # tokens 0 .. last action − 1: SGLang's rows
  np.testing.assert_array_equal(traj.routed_experts[:, 0], traj.token_ids[:last_action])
  assert traj.to_bytes() and type(traj).from_bytes(traj.to_bytes()) == traj


def test_a_record_of_the_wrong_length_fails_the_episode():
  traj = _episode(RoutingEngine(extra_rows=1))
  assert traj.status == Status.ENV_ERROR and "routed_experts" in traj.metadata["error"]


def test_the_proxy_keeps_the_last_turns_record_too():
  """The token-capturing proxy (proxied scaffolds) follows the same rule per segment."""
  from sao.rollout.proxy import TokenCapturingProxy  # pylint: disable=g-import-not-at-top
  from tests.rollout.test_proxy import ScriptedEngine  # pylint: disable=g-import-not-at-top

  class RoutingScripted(ScriptedEngine):
    async def generate(self, input_ids, sampling_params):
      result = await super().generate(input_ids, sampling_params)
      fed = list(input_ids) + list(result.token_ids)[:-1]
      return dataclasses.replace(result, routed_experts=np.repeat(np.asarray(fed, np.int32)[:, None], COLUMNS, 1))

  env = envs.make("number_search")
  messages = env.reset(env.tasks("train", 1, 0)[0])
  proxy = TokenCapturingProxy(RoutingScripted(TOKENIZER, ["lower?", "higher?"]), TOKENIZER)

  async def main():
    first = await proxy.chat_completion("s", {"model": "m", "messages": messages})
    follow = messages + [first["choices"][0]["message"], {"role": "user", "content": "go on"}]
    await proxy.chat_completion("s", {"model": "m", "messages": follow})
    return proxy.trajectories("s")

  (traj,) = asyncio.run(main())
  assert traj.num_turns == 2
  last_action = traj.reward_token_index()
  assert traj.routed_experts.shape == (last_action, COLUMNS)
  np.testing.assert_array_equal(traj.routed_experts[:, 0], traj.token_ids[:last_action])
