"""A scaffold's client error through the proxy is not an environment failure: a conversation that outgrows the
engine's context ends `truncated` (as the agent loop's budget stop), with what was recorded before it intact."""
from __future__ import annotations

import asyncio

import openai

from sao.engines.sglang_client import EngineError, GenerateResult
from sao.models.sampling import SamplingParams
from sao.models.tokenizer import toy_tokenizer
from sao.rollout import envs
from sao.rollout.agent import EpisodeLimits
from sao.rollout.harnesses.proxied import ProxiedHarness
from sao.transport.trajectory import Status

CONTEXT = 400


class SmallContextEngine:
  """Answers "ok"; refuses prompts of CONTEXT tokens or more with the local engine's 400."""

  def __init__(self, tokenizer):
    self.tokenizer = tokenizer

  async def generate(self, input_ids, sampling_params):
    if len(input_ids) >= CONTEXT:
      raise EngineError("/generate", f"input_ids: prompt of {len(input_ids)} tokens does not fit the context "
                        f"length {CONTEXT}", 400)
    ids = self.tokenizer.encode("ok") + [self.tokenizer.eos_token_id]
    return GenerateResult(tuple(ids), tuple([-0.5] * len(ids)), "stop", weight_version="3",
                          prompt_tokens=len(input_ids))


class GrowingScaffold(ProxiedHarness):
  """Keeps appending a long user message until the proxy refuses the conversation."""
  name = "growing"

  def format_call(self, call, env):
    raise NotImplementedError

  async def scaffold(self, client: openai.AsyncOpenAI, env, task, settings):
    messages = env.reset(task)
    for _ in range(50):
      reply = await client.chat.completions.create(model="m", messages=messages, max_tokens=4)
      messages += [reply.choices[0].message.model_dump(exclude_none=True),
                   {"role": "user", "content": "keep going " * 10}]
    return Status.OK


def test_outgrowing_the_context_ends_truncated_not_env_error():
  tokenizer = toy_tokenizer()
  env = envs.make("number_search")
  task = env.tasks("train", 1, 0)[0]
  traj = asyncio.run(GrowingScaffold().run_episode(SmallContextEngine(tokenizer), tokenizer, env, task,
                                                   SamplingParams(max_new_tokens=4), EpisodeLimits()))
  assert traj.status == Status.TRUNCATED and "error" not in traj.metadata, traj.metadata
  assert traj.num_turns >= 2 and traj.num_tokens < CONTEXT
  traj.validate(tokenizer.vocab_size)
