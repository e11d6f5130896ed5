"""Agent-loop invariants on real engine output (a local engine server on loopback, tiny random model)."""
from __future__ import annotations

import asyncio
import threading
import time

import jax
import numpy as np
import pytest

from sao.engines.sglang_client import GenerateResult, SGLangEngine
from sao.models.hf import load_pretrained
from sao.models.logprobs import token_logprobs
from sao.models.sampling import SamplingParams
from sao.models.tokenizer import toy_tokenizer
from sao.rollout import envs
from sao.rollout.agent import EpisodeLimits, run_episode, run_episodes
from sao.transport.trajectory import Status
from tests.engines.helpers import save_tiny_model, start_engine

SAMPLING = SamplingParams(max_new_tokens=16, temperature=1.0)
LIMITS = EpisodeLimits(max_turns=4, max_total_tokens=480, timeout_s=120)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  model_dir = save_tiny_model(str(tmp_path_factory.mktemp("agent") / "model"), seed=0)
  cache = str(tmp_path_factory.getbasetemp() / "jax_cache")
  proc, url = start_engine(model_dir, cache)
  yield {"url": url, "model_dir": model_dir, "cache": cache}
  proc.stop()


@pytest.fixture(scope="module")
def tokenizer():
  return toy_tokenizer()


def tasks(n, seed=0):
  return envs.make("number_search").tasks("train", n, seed)


def episodes(url, tokenizer, n, limits=LIMITS, concurrency=64):
  async def main():
    async with SGLangEngine(url, timeout_s=120) as engine:
      trajs = await run_episodes(engine, tokenizer, "number_search", tasks(n), SAMPLING, limits, concurrency)
      return trajs, await engine.get_model_info()
  return asyncio.run(main())


def action_runs(mask):
  """[(start, end)) of each contiguous run of action tokens."""
  edges = np.diff(np.concatenate([[0], mask.astype(int), [0]]))
  return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)))


def test_trajectory_invariants_on_real_engine_output(served, tokenizer):
  trajs, _ = episodes(served["url"], tokenizer, 4)
  config, params = load_pretrained(served["model_dir"])
  gen_prompt = tokenizer.generation_prompt_ids()
  end_ids = tokenizer.assistant_end_ids()
  ids = np.zeros((len(trajs), 512), np.int32)
  mask = np.zeros_like(ids)
  for i, t in enumerate(trajs):
    t.validate(config.vocab_size)
    assert t.status in (Status.OK, Status.TRUNCATED) and t.num_tokens <= LIMITS.max_total_tokens
    env = envs.make("number_search")
    prompt = tokenizer.apply_chat_template(env.reset(tasks(4)[i]), tools=env.tool_schemas)
    assert t.token_ids[:len(prompt)].tolist() == prompt and not t.action_mask[:len(prompt)].any()
    runs = action_runs(t.action_mask)
    assert len(runs) == t.num_turns >= 1
    assert np.all(t.rollout_logprobs[t.action_mask] < 0) and np.all(t.rollout_logprobs[~t.action_mask] == 0)
    assert t.reward_token_index() == runs[-1][1] - 1
    assert t.turn_boundaries[0] == 0 and t.turn_boundaries[1] > 0  # the user message
    for start, end in runs:  # each assistant turn starts at a boundary, with the generation prompt before it
      assert start - len(gen_prompt) in t.turn_boundaries
      assert t.token_ids[start - len(gen_prompt):start].tolist() == gen_prompt
      after = t.token_ids[end:end + 3].tolist()
      assert after[:len(end_ids)] == end_ids or after[1:1 + len(end_ids)] == end_ids  # (eos if length-capped)
    # The random policy never writes a valid call: every observation is the parser's error message.
    assert "<tool_response>error: " in tokenizer.decode(t.token_ids.tolist())
    assert t.timings["generate_s"] > 0 and t.policy_version == 0 and t.metadata["env"] == "number_search"
    ids[i, :t.num_tokens] = t.token_ids
    mask[i, :t.num_tokens] = 1
  # The engine's log-probs equal the policy's, recomputed on the full sequences (temperature 1).
  lp = np.asarray(jax.jit(token_logprobs, static_argnames=("config",))(params, config, ids, mask, 1.0))
  for i, t in enumerate(trajs):
    np.testing.assert_allclose(lp[i, :t.num_tokens][t.action_mask], t.rollout_logprobs[t.action_mask], atol=3e-5)


def test_status_on_max_turns_and_token_limit(served, tokenizer):
  (turns,), _ = episodes(served["url"], tokenizer, 1, EpisodeLimits(max_turns=2, max_total_tokens=480))
  assert turns.status == Status.TRUNCATED and turns.num_turns == 2
  (tokens,), _ = episodes(served["url"], tokenizer, 1, EpisodeLimits(max_turns=8, max_total_tokens=150))
  assert tokens.status == Status.TRUNCATED and tokens.num_tokens <= 150 and tokens.num_turns >= 1
  tokens.validate(tokenizer.vocab_size)


class SlowNumberSearch(envs.NumberSearch):
  """A tool that blocks until released (or 10 s)."""

  def __init__(self, release: threading.Event):
    super().__init__()
    self.release = release

  def _step(self, call):
    self.release.wait(10)
    return super()._step(call)

  def step(self, call):
    self.release.wait(10)
    return super().step(call)


def test_wall_clock_timeout(served, tokenizer):
  release = threading.Event()

  async def main():
    async with SGLangEngine(served["url"]) as engine:
      start = time.monotonic()
      traj = await run_episode(engine, tokenizer, SlowNumberSearch(release), tasks(1)[0], SAMPLING,
                               EpisodeLimits(timeout_s=3.0))
      elapsed = time.monotonic() - start
      release.set()
      return traj, elapsed

  traj, elapsed = asyncio.run(main())
  # elapsed < the env's 10 s wait: stopped at the timeout, not waited out.
  assert traj.status == Status.TIMEOUT and not traj.is_trainable and elapsed < 9
  assert "exceeded 3.0s" in traj.metadata["error"]


def test_engine_dying_mid_episode_gives_env_error(served, tokenizer, tmp_path):
  proc, url = start_engine(served["model_dir"], served["cache"])

  class KillingEnv(envs.NumberSearch):
    def step(self, call):
      if self.turns == 1:
        proc.stop()  # the engine process dies after the second model turn
      return super().step(call)

  async def main():
    async with SGLangEngine(url, max_retries=1, backoff_s=0.01) as engine:
      return await run_episode(engine, tokenizer, KillingEnv(), tasks(1)[0], SAMPLING, LIMITS)

  try:
    traj = asyncio.run(main())
  finally:
    proc.stop()
  assert traj.status == Status.ENV_ERROR and traj.num_turns == 2
  assert "failed after 2 attempts" in traj.metadata["error"]
  traj.validate(tokenizer.vocab_size)  # what it had is still a well-formed record (dropped by the learner)


class ScriptedEngine:
  """Replays fixed assistant texts (an Engine-protocol stand-in for exact tool-call parsing checks)."""

  def __init__(self, tokenizer, texts):
    self.tokenizer, self.texts, self.calls = tokenizer, list(texts), 0

  async def generate(self, input_ids, sampling_params):
    text = self.texts[min(self.calls, len(self.texts) - 1)]
    self.calls += 1
    ids = self.tokenizer.encode(text) + [self.tokenizer.eos_token_id]
    return GenerateResult(tuple(ids), tuple([-0.5] * len(ids)), "stop", weight_version=str(3 + self.calls))


def test_invalid_json_tool_call_gets_error_observation(tokenizer):
  task = tasks(1)[0]
  texts = ['<tool_call>{"name": "compare", "arguments": {"guess": 1</tool_call>',
           f'<tool_call>{{"name": "compare", "arguments": {{"guess": {task["target"]}}}}}</tool_call>']
  engine = ScriptedEngine(tokenizer, texts)
  traj = asyncio.run(run_episode(engine, tokenizer, envs.make("number_search"), task, SAMPLING, LIMITS))
  traj.validate(tokenizer.vocab_size)
  text = tokenizer.decode(traj.token_ids.tolist())
  assert "<tool_response>error: invalid JSON at char" in text and "<tool_response>equal</tool_response>" in text
  assert traj.status == Status.OK and traj.reward == 1.0 and traj.num_turns == 2
  assert traj.policy_version == 4  # min over the turns' weight versions (4, 5)
  # Sampled ids went in verbatim: each action run is exactly what the engine returned.
  runs = action_runs(traj.action_mask)
  assert traj.token_ids[runs[0][0]:runs[0][1]].tolist() == tokenizer.encode(texts[0]) + [tokenizer.eos_token_id]


def test_over_100_concurrent_loops_against_one_engine(served, tokenizer):
  start = time.monotonic()
  trajs, info = episodes(served["url"], tokenizer, 104, EpisodeLimits(max_turns=3, max_total_tokens=480),
                         concurrency=128)
  assert len(trajs) == 104 and len({t.task_id for t in trajs}) == 104
  for t in trajs:
    t.validate(tokenizer.vocab_size)
    assert t.status == Status.TRUNCATED and t.num_turns == 3
  assert info["stats"]["max_rows_per_batch"] >= 32, info["stats"]
  print(f"104 episodes in {time.monotonic() - start:.1f}s; engine stats {info['stats']}")
