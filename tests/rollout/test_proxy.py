"""Token-capturing proxy: the `openai` client drives scripted agents through it against a real local engine."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import jax
import numpy as np
import openai
import pytest
from aiohttp import web

from sao.engines.sglang_client import GenerateResult, SGLangEngine
from sao.models.hf import load_pretrained
from sao.models.logprobs import token_logprobs
from sao.models.tokenizer import toy_tokenizer
from sao.rollout import envs
from sao.rollout.proxy import TokenCapturingProxy, trajectory_from_json
from sao.rollout.tool_format import ToolCall
from tests.engines.helpers import save_tiny_model, start_engine


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  model_dir = save_tiny_model(str(tmp_path_factory.mktemp("proxy") / "model"), seed=0)
  proc, url = start_engine(model_dir, str(tmp_path_factory.getbasetemp() / "jax_cache"))
  yield {"url": url, "model_dir": model_dir}
  proc.stop()


async def serve_proxy(proxy: TokenCapturingProxy) -> tuple[web.AppRunner, str]:
  runner = web.AppRunner(proxy.app())
  await runner.setup()
  await web.TCPSite(runner, "127.0.0.1", 0).start()
  host, port = runner.addresses[0][:2]
  return runner, f"http://{host}:{port}"


async def scripted_agent(client: openai.AsyncOpenAI, env: envs.Env, task: dict, turns: int) -> list[dict]:
  """A minimal scaffold: OpenAI tool calling, tool results as `tool` messages, a nudge when no call was made."""
  messages = env.reset(task)
  for _ in range(turns):
    resp = await client.chat.completions.create(model="sao", messages=messages, tools=env.tool_schemas,
                                                max_tokens=16, temperature=1.0)
    msg = resp.choices[0].message
    messages.append(msg.model_dump(exclude_none=True))
    if msg.tool_calls:
      call = msg.tool_calls[0]
      observation, done = env.step(ToolCall(call.function.name, json.loads(call.function.arguments)))
      messages.append({"role": "tool", "tool_call_id": call.id, "content": observation})
      if done:
        break
    else:
      messages.append({"role": "user", "content": "Call compare."})
  return messages


def test_openai_client_round_trip_records_tokens_masks_logprobs(served):
  tokenizer = toy_tokenizer()
  env = envs.make("number_search")
  task = env.tasks("train", 1, 0)[0]

  async def main():
    async with SGLangEngine(served["url"]) as engine:
      proxy = TokenCapturingProxy(engine, tokenizer)
      runner, url = await serve_proxy(proxy)
      try:
        client = openai.AsyncOpenAI(base_url=f"{url}/sessions/ep-1/v1", api_key="unused", max_retries=0)
        await scripted_agent(client, env, task, turns=3)
        async with aiohttp.ClientSession() as http:
          async with http.get(f"{url}/sessions/ep-1/trajectory") as resp:
            body = await resp.json()
          async with http.get(f"{url}/sessions/nope/trajectory") as resp:
            assert resp.status == 404
        return proxy.trajectories("ep-1", reward=0.0, task_id=task["task_id"]), body
      finally:
        await runner.cleanup()

  (traj,), body = asyncio.run(main())
  assert len(body["segments"]) == 1
  assert trajectory_from_json(body["segments"][0]).token_ids.tolist() == traj.token_ids.tolist()
  traj.validate(tokenizer.vocab_size)
  assert traj.num_turns == 3 and "segment_reason" not in traj.metadata
  first = tokenizer.apply_chat_template(envs.make("number_search").reset(task), tools=env.tool_schemas)
  assert traj.token_ids[:len(first)].tolist() == first
  edges = np.diff(np.concatenate([[0], traj.action_mask.astype(int), [0]]))
  assert (edges == 1).sum() == 3
  assert "<|im_start|>user\nCall compare.<|im_end|>" in tokenizer.decode(traj.token_ids.tolist())
  # Recorded log-probs are the policy's on the recorded sequence: nothing was re-tokenised.
  config, params = load_pretrained(served["model_dir"])
  ids = np.zeros((1, 512), np.int32)
  ids[0, :traj.num_tokens] = traj.token_ids
  mask = (np.arange(512) < traj.num_tokens).astype(np.int32)[None]
  lp = np.asarray(jax.jit(token_logprobs, static_argnames=("config",))(params, config, ids, mask, 1.0))[0]
  np.testing.assert_allclose(lp[:traj.num_tokens][traj.action_mask], traj.rollout_logprobs[traj.action_mask],
                             atol=3e-5)


class ScriptedEngine:
  """Replays fixed assistant texts, so tool-call parsing and segmenting are checked exactly."""

  def __init__(self, tokenizer, texts):
    self.tokenizer, self.texts, self.calls = tokenizer, texts, 0

  async def generate(self, input_ids, sampling_params):
    ids = self.tokenizer.encode(self.texts[self.calls % len(self.texts)]) + [self.tokenizer.eos_token_id]
    self.calls += 1
    return GenerateResult(tuple(ids), tuple([-0.25] * len(ids)), "stop", weight_version="5",
                          prompt_tokens=len(input_ids))


def test_tool_calls_and_history_rewrite_start_a_new_segment():
  tokenizer = toy_tokenizer()
  env = envs.make("number_search")
  task = env.tasks("train", 1, 0)[0]
  call_text = '<tool_call>{"name": "compare", "arguments": {"guess": 32}}</tool_call>'
  engine = ScriptedEngine(tokenizer, [call_text])

  async def main():
    proxy = TokenCapturingProxy(engine, tokenizer)
    runner, url = await serve_proxy(proxy)
    try:
      client = openai.AsyncOpenAI(base_url=f"{url}/sessions/s/v1", api_key="unused", max_retries=0)
      messages = env.reset(task)
      resp = await client.chat.completions.create(model="m", messages=messages, tools=env.tool_schemas)
      choice = resp.choices[0]
      assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "compare"
      assert json.loads(choice.message.tool_calls[0].function.arguments) == {"guess": 32}
      messages.append(choice.message.model_dump(exclude_none=True))
      messages.append({"role": "tool", "tool_call_id": choice.message.tool_calls[0].id, "content": "higher"})
      await client.chat.completions.create(model="m", messages=messages, tools=env.tool_schemas)
      assert len(proxy.trajectories("s")) == 1  # an extension: same segment
      # The scaffold "compacts" its history: the first user message changes → a new segment.
      compacted = [messages[0], {"role": "user", "content": "Find the number in 1..64. It is above 32."}]
      await client.chat.completions.create(model="m", messages=compacted, tools=env.tool_schemas)
      with pytest.raises(openai.BadRequestError, match="messages: required"):
        await client.chat.completions.create(model="m", messages=[])
      return proxy.trajectories("s", reward=1.0)
    finally:
      await runner.cleanup()

  first, second = asyncio.run(main())
  for t in (first, second):
    t.validate(tokenizer.vocab_size)
    assert t.policy_version == 5 and t.reward == 1.0
  assert first.num_turns == 2 and second.num_turns == 1
  assert second.metadata["segment_reason"].startswith("history rewritten: message 1 differs")
  assert second.metadata["segment"] == "1" and second.metadata["num_segments"] == "2"
  text = tokenizer.decode(first.token_ids.tolist())
  assert text.count(call_text) == 2 and "<tool_response>higher</tool_response>" in text
  sampled = tokenizer.encode(call_text) + [tokenizer.eos_token_id]
  runs = np.flatnonzero(np.diff(np.concatenate([[0], first.action_mask.astype(int)])) == 1)
  assert first.token_ids[runs[0]:runs[0] + len(sampled)].tolist() == sampled
