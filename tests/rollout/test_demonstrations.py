"""Demonstrations tokenise exactly as the agent loop builds a rollout of the same actions (SFT = what RL continues)."""
import asyncio

import numpy as np
import pytest

from sao.engines.sglang_client import GenerateResult
from sao.models.tokenizer import toy_tokenizer
from sao.rollout import agent, envs, tool_format
from sao.rollout.demonstrations import demonstration_to_trajectory, demonstration_trajectories


class ReplayEngine:
  """An engine that 'samples' a fixed list of assistant texts, one per turn, with the stop token."""

  def __init__(self, tokenizer, texts):
    self.tokenizer = tokenizer
    self.texts = list(texts)

  async def generate(self, input_ids, sampling_params):
    del input_ids, sampling_params
    ids = self.tokenizer.encode(self.texts.pop(0)) + [self.tokenizer.eos_token_ids[0]]
    return GenerateResult(token_ids=tuple(ids), logprobs=tuple([-0.25] * len(ids)), finish_reason="stop",
                          weight_version="3")


@pytest.mark.parametrize("env_name,kwargs", [("number_search", {"n": 16}), ("code_repair", {})])
def test_demonstration_tokens_equal_agent_loop_tokens(env_name, kwargs):
  tokenizer = toy_tokenizer()
  env = envs.make(env_name, **kwargs)
  task = env.tasks("train", 1, seed=3)[0]
  demo = env.demonstrate(task, np.random.default_rng(0), noise=0.3)
  expected = demonstration_to_trajectory(demo, tokenizer, env.tool_schemas)
  texts = [tool_format.format_tool_call(call) for call in demo.calls]
  played = asyncio.run(agent.run_episode(ReplayEngine(tokenizer, texts), tokenizer, envs.make(env_name, **kwargs),
                                         task, limits=agent.EpisodeLimits(max_turns=64, max_total_tokens=8192)))
  assert played.status == "ok", played.metadata
  np.testing.assert_array_equal(played.token_ids, expected.token_ids)
  np.testing.assert_array_equal(played.action_mask, expected.action_mask)
  assert played.reward == expected.reward == demo.reward
  assert played.num_turns == expected.num_turns == len(demo.calls)
  # The loop records the engine's log-probs on exactly the demonstration's action tokens.
  np.testing.assert_array_equal(played.rollout_logprobs != 0, expected.action_mask)


def test_demonstration_trajectories_validate_and_are_deterministic():
  tokenizer = toy_tokenizer()
  a = demonstration_trajectories("number_search", tokenizer, 20, seed=1, noise=0.5, env_kwargs={"n": 16})
  b = demonstration_trajectories("number_search", tokenizer, 20, seed=1, noise=0.5, env_kwargs={"n": 16})
  assert len(a) == 20
  for x, y in zip(a, b):
    x.validate(tokenizer.vocab_size)
    np.testing.assert_array_equal(x.token_ids, y.token_ids)
  rewards = [t.reward for t in a]
  assert 0 < np.mean(rewards) < 1  # noisy expert: some failures, some successes
  ok = demonstration_trajectories("number_search", tokenizer, 20, seed=1, noise=0.5, successful_only=True,
                                  env_kwargs={"n": 16})
  assert ok and all(t.reward == 1.0 for t in ok)
