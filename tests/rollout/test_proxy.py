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

from sao.engines.sglang_client import EngineError, EngineUnavailableError, GenerateResult, SGLangEngine
from sao.models.hf import load_pretrained
from sao.models.logprobs import token_logprobs
from sao.models.tokenizer import toy_tokenizer
from sao.rollout import envs
from sao.rollout.proxy import ProxyRequestError, TokenCapturingProxy, trajectory_from_json
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


# ---- bad input, engine refusals, session bound, auth (scripted engine: no model) ------------------------------

class RefusingEngine(ScriptedEngine):
  """Answers like ScriptedEngine, or raises the next queued EngineError."""

  def __init__(self, tokenizer, texts):
    super().__init__(tokenizer, texts)
    self.errors = []

  async def generate(self, input_ids, sampling_params):
    if self.errors:
      raise self.errors.pop(0)
    return await super().generate(input_ids, sampling_params)


GOOD = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
MALFORMED = [  # (request body, the param the 400 must name)
    ({**GOOD, "messages": ["hi"]}, "messages[0]"),
    ({**GOOD, "messages": "hi"}, "messages"),
    ({**GOOD, "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({**GOOD, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({**GOOD, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]"),
    ({**GOOD, "messages": [*GOOD["messages"], {"role": "assistant", "tool_calls": ["x"]}]},
     "messages[1].tool_calls[0]"),
    ({**GOOD, "messages": [*GOOD["messages"], {"role": "assistant", "tool_calls": "x"}]}, "messages[1].tool_calls"),
    ({**GOOD, "temperature": "hot"}, "temperature"),
    ({**GOOD, "temperature": -1.0}, "temperature"),
    ({**GOOD, "max_tokens": "x"}, "max_tokens"),
    ({**GOOD, "max_tokens": -5}, "max_tokens"),
    ({**GOOD, "max_tokens": 2**40}, "max_tokens"),
    ({**GOOD, "max_completion_tokens": 0}, "max_completion_tokens"),
    ({**GOOD, "top_p": 1.5}, "top_p"),
    ({**GOOD, "top_k": "3"}, "top_k"),
    ({**GOOD, "n": 2}, "n"),
    ({**GOOD, "stream": True}, "stream"),
    ({**GOOD, "stop": ["\n"]}, "stop"),
    ({**GOOD, "stop": "END"}, "stop"),
    ({**GOOD, "logit_bias": {"5": 10}}, "logit_bias"),
    ({**GOOD, "presence_penalty": 0.5}, "presence_penalty"),
    ({**GOOD, "frequency_penalty": False}, "frequency_penalty"),
    ({**GOOD, "repetition_penalty": 1.1}, "repetition_penalty"),
    ({**GOOD, "tools": "x"}, "tools"),
    ({**GOOD, "tools": [{"type": "function"}]}, "tools[0]"),
]


def test_sampling_fields_at_their_off_values_are_accepted():
  from sao.rollout.proxy_checks import check_sampling  # pylint: disable=g-import-not-at-top
  off = {"stop": None, "logit_bias": {}, "presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
         "min_p": 0}
  sampling = check_sampling({**GOOD, **off}, 16, (3,))
  assert sampling.max_new_tokens == 8 and sampling.stop_token_ids == (3,)
  assert check_sampling({**GOOD, "stop": []}, 16, (3,)) == check_sampling(GOOD, 16, (3,))


async def post(http, url, body, **kwargs):
  async with http.post(url, data=body if isinstance(body, str) else json.dumps(body), **kwargs) as resp:
    return resp.status, await resp.json()


def assert_openai_error(status, body, want_status, param=None, code=None):
  assert status == want_status, body
  assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
  assert body["error"]["param"] == param and (code is None or body["error"]["code"] == code), body


def test_malformed_requests_get_openai_400_and_leave_no_trace():
  tokenizer = toy_tokenizer()
  engine = RefusingEngine(tokenizer, ["ok"])

  async def main():
    proxy = TokenCapturingProxy(engine, tokenizer)
    runner, url = await serve_proxy(proxy)
    try:
      async with aiohttp.ClientSession() as http:
        chat = f"{url}/sessions/bad/v1/chat/completions"
        for body, param in MALFORMED:
          status, reply = await post(http, chat, body)
          assert_openai_error(status, reply, 400, param)
          assert reply["error"]["type"] == "invalid_request_error" and "Traceback" not in reply["error"]["message"]
        assert_openai_error(*await post(http, chat, "{not json"), 400, None, "invalid_json")
        # Nested deeper than the parser recurses: still a JSON 400, not a plain-text 500.
        assert_openai_error(*await post(http, chat, "[" * 200_000 + "]" * 200_000), 400, None, "invalid_json")
        assert not proxy.sessions and engine.calls == 0  # nothing was created, the engine never asked
        # A valid turn, then invalid ones in the same session: the record is unchanged and not an env error.
        good = f"{url}/sessions/s/v1/chat/completions"
        assert (await post(http, good, GOOD))[0] == 200
        before = proxy.trajectories("s")[0]
        again = {**GOOD, "messages": GOOD["messages"] + [{"role": "assistant", "content": "ok"},
                                                        {"role": "user", "content": "more"}]}
        for bad in ({**again, "temperature": -1}, {**again, "max_tokens": -1}, {**again, "messages": [7]}):
          assert (await post(http, good, bad))[0] == 400
        (after,) = proxy.trajectories("s")
        assert after.token_ids.tolist() == before.token_ids.tolist() and after.status == "ok"
        assert (await post(http, good, again))[0] == 200  # the session still extends as if nothing happened
        (extended,) = proxy.trajectories("s")
        assert extended.num_turns == 2 and extended.token_ids[:before.num_tokens].tolist() == before.token_ids.tolist()
    finally:
      await runner.cleanup()

  asyncio.run(main())


def test_engine_refusal_is_a_client_error_and_engine_failure_an_env_error():
  tokenizer = toy_tokenizer()
  engine = RefusingEngine(tokenizer, ["ok"])

  async def main():
    proxy = TokenCapturingProxy(engine, tokenizer, context_length=40)
    runner, url = await serve_proxy(proxy)
    try:
      async with aiohttp.ClientSession() as http:
        chat = f"{url}/sessions/s/v1/chat/completions"
        assert (await post(http, chat, GOOD))[0] == 200
        before = proxy.trajectories("s")[0].token_ids.tolist()
        # Longer than the proxy's context_length: refused before the engine is asked.
        long = {**GOOD, "messages": [{"role": "user", "content": "x " * 200}]}
        assert_openai_error(*await post(http, chat, long), 400, "messages", "context_length_exceeded")
        assert engine.calls == 1 and len(proxy.trajectories("s")) == 1
        # The engine's own 400 (its context is smaller than the proxy knows): still the client's error.
        engine.errors.append(EngineError("/generate", "input_ids: prompt of 30 tokens does not fit the context "
                                         "length 16", 400))
        assert_openai_error(*await post(http, chat, GOOD | {"max_tokens": 4}), 400, "messages",
                            "context_length_exceeded")
        (seg,) = proxy.trajectories("s")
        assert seg.status == "ok" and seg.token_ids.tolist() == before
        # An engine failure is the environment's: 502 and the segment is marked env_error.
        engine.errors.append(EngineUnavailableError("/generate", "connection refused"))
        assert_openai_error(*await post(http, chat, {**GOOD, "messages": [{"role": "user", "content": "b"}]}),
                            502, None, "engine_error")
        return proxy.trajectories("s")
    finally:
      await runner.cleanup()

  ok, failed = asyncio.run(main())
  assert ok.status == "ok" and failed.status == "env_error"


def test_live_sessions_are_bounded_lru_and_idle():
  tokenizer = toy_tokenizer()
  now = [0.0]
  proxy = TokenCapturingProxy(ScriptedEngine(tokenizer, ["ok"]), tokenizer, max_sessions=3, session_idle_s=10.0,
                              clock=lambda: now[0])

  async def chat(sid):
    now[0] += 1.0
    return await proxy.chat_completion(sid, GOOD)

  async def main():
    for sid in ("a", "b", "c", "a", "d"):  # "d" evicts the least recently used: "b"
      await chat(sid)
    assert list(proxy.sessions) == ["c", "a", "d"] and proxy.evicted_sessions == 1
    now[0] += 60.0  # all idle past 10 s: the next new session clears them
    await chat("e")
    assert list(proxy.sessions) == ["e"] and proxy.evicted_sessions == 4
    for i in range(100):  # the report's probe: sessions kept growing (41 → 91)
      await chat(f"probe-{i}")
    assert len(proxy.sessions) == 3
    # A session with a request in flight is never evicted; when all are busy a new session is refused (503).
    held = [s.lock for s in proxy.sessions.values()]
    for lock in held:
      await lock.acquire()
    with pytest.raises(ProxyRequestError, match="too many live sessions") as e:
      await chat("new")
    assert e.value.status == 503 and len(proxy.sessions) == 3
    for lock in held:
      lock.release()
    await chat("new")
    assert "new" in proxy.sessions

  asyncio.run(main())
  with pytest.raises(ValueError, match="max_sessions"):
    TokenCapturingProxy(ScriptedEngine(tokenizer, ["ok"]), tokenizer, max_sessions=0)


def test_proxy_token_rule():
  tokenizer = toy_tokenizer()

  async def main():
    with pytest.raises(ValueError, match="refusing to bind non-loopback host '0.0.0.0' without a token"):
      await TokenCapturingProxy(ScriptedEngine(tokenizer, ["ok"]), tokenizer).serve("0.0.0.0", 0)
    open_proxy = TokenCapturingProxy(ScriptedEngine(tokenizer, ["ok"]), tokenizer)
    runner, url = await open_proxy.serve()  # loopback: no token needed
    try:
      client = openai.AsyncOpenAI(base_url=f"{url}/sessions/s/v1", api_key="anything", max_retries=0)
      await client.chat.completions.create(**GOOD)
    finally:
      await runner.cleanup()
    proxy = TokenCapturingProxy(ScriptedEngine(tokenizer, ["ok"]), tokenizer, api_key="s3cret")
    runner, url = await proxy.serve()
    try:
      wrong = openai.AsyncOpenAI(base_url=f"{url}/sessions/s/v1", api_key="guess", max_retries=0)
      with pytest.raises(openai.AuthenticationError, match="missing or wrong token"):
        await wrong.chat.completions.create(**GOOD)
      async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/sessions/s/trajectory") as resp:
          assert resp.status == 401
      right = openai.AsyncOpenAI(base_url=f"{url}/sessions/s/v1", api_key="s3cret", max_retries=0)
      reply = await right.chat.completions.create(**GOOD)
      assert reply.choices[0].message.content == "ok" and list(proxy.sessions) == ["s"]
    finally:
      await runner.cleanup()

  asyncio.run(main())
