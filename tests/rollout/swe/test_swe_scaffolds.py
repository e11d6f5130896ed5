"""The two SWE scaffolds (`openai_tools`: OpenHands-style function calling; `bash_only`: mini-swe-agent-style) drive
the "swe" environment only through the token-capturing proxy: the scripted expert resolves the issue through each,
a babbling policy gets format errors and a truncated episode, token budgets hold, and the recorded stream is what
the engine sampled."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from sao.engines.sglang_client import GenerateResult
from sao.models.sampling import SamplingParams
from sao.models.tokenizer import toy_tokenizer
from sao.rollout import agent, envs, harnesses
from sao.rollout.harnesses import bash_only, expert
from sao.rollout.tool_format import ToolCall
from sao.transport.trajectory import Status

SCAFFOLDS = ("openai_tools", "bash_only")
# The generated dataset's expert form (task["expert"]): repro, grep, view, str_replace, tests, submit.
CALC_FIX = {"path": "calc/ops.py", "old": "        return lo\n    return x", "new": "        return hi\n    return x",
            "repro": "python -c 'from calc.ops import clamp; print(clamp(50, 0, 10))'", "symbol": "clamp"}


@pytest.fixture(scope="module")
def tokenizer():
  return toy_tokenizer()


def _env(calc_dataset, **kw):
  jsonl, root, _ = calc_dataset
  return envs.make("swe", jsonl=str(jsonl), snapshot_root=str(root), command_timeout_s=20, **kw)


class TextEngine:
  """Samples fixed assistant texts in turn (the last one repeats), with the stop token and log-prob -0.5."""

  def __init__(self, tokenizer, texts):
    self.tokenizer, self.texts, self.prompts = tokenizer, list(texts), []

  async def generate(self, input_ids, sampling_params):
    self.prompts.append(list(input_ids))
    text = self.texts.pop(0) if len(self.texts) > 1 else self.texts[0]
    ids = self.tokenizer.encode(text)[:sampling_params.max_new_tokens - 1] + [self.tokenizer.eos_token_id]
    return GenerateResult(tuple(ids), tuple([-0.5] * len(ids)), "stop", weight_version="2",
                          prompt_tokens=len(input_ids))


@pytest.mark.parametrize("name", SCAFFOLDS)
@pytest.mark.parametrize("with_fix", [False, True], ids=["gold_patch", "editor_fix"])
def test_expert_resolves_the_issue_through_each_scaffold(calc_dataset, tokenizer, name, with_fix):
  env = _env(calc_dataset)
  task = env.task_pool()[0]
  if with_fix:
    task = dict(task, expert=CALC_FIX)
  try:
    traj = asyncio.run(expert.demonstrate(harnesses.get(name), env, task, tokenizer))
  finally:
    env.close()
  traj.validate(tokenizer.vocab_size)
  assert traj.status == Status.OK and traj.reward == 1.0 and traj.harness == name, traj.metadata
  text = tokenizer.decode(traj.token_ids.tolist())
  if name == "bash_only":
    assert "```bash\n" in text and bash_only.SUBMIT_COMMAND in text and "<tool_call>" not in text
  else:
    assert '<tool_call>{"name": "submit"' in text and "Tools:" in text


@pytest.mark.parametrize("name", SCAFFOLDS)
def test_babbling_policy_gets_errors_and_is_truncated(calc_dataset, tokenizer, name):
  env = _env(calc_dataset, autosubmit=False)
  engine = TextEngine(tokenizer, ["I am not sure what to do."])
  sampling = SamplingParams(max_new_tokens=32, temperature=1.0)
  try:
    traj = asyncio.run(harnesses.get(name).run_episode(
        engine, tokenizer, env, env.task_pool()[0], sampling, agent.EpisodeLimits(max_turns=3, max_total_tokens=8192,
                                                                                  timeout_s=60), sample_index=2,
        group_id="g", lease_id="l"))
  finally:
    env.close()
  traj.validate(tokenizer.vocab_size)
  assert traj.status == Status.TRUNCATED and traj.reward == 0.0 and traj.num_turns == 3, traj.metadata
  assert (traj.sample_index, traj.group_id, traj.lease_id, traj.policy_version) == (2, "g", "l", 2)
  text = tokenizer.decode(traj.token_ids.tolist())
  assert text.count("EXACTLY ONE action" if name == "bash_only" else "error: no tool call") == 2
  # The stream is the engine's: each request's prompt is a prefix of the final trajectory, sampled ids mask 1.
  for prompt in engine.prompts:
    assert traj.token_ids[:len(prompt)].tolist() == prompt
  assert np.all(traj.rollout_logprobs[traj.action_mask] == -0.5)


@pytest.mark.parametrize("name", SCAFFOLDS)
def test_token_budget_stops_before_overflow(calc_dataset, tokenizer, name):
  env = _env(calc_dataset)
  call = ToolCall("bash", {"command": "cat calc/ops.py tests/test_ops.py"})
  engine = TextEngine(tokenizer, [harnesses.get(name).format_call(call, env)])
  budget = 3000
  try:
    traj = asyncio.run(harnesses.get(name).run_episode(
        engine, tokenizer, env, env.task_pool()[0], SamplingParams(max_new_tokens=64),
        agent.EpisodeLimits(max_turns=20, max_total_tokens=budget, timeout_s=60)))
  finally:
    env.close()
  assert traj.status == Status.TRUNCATED and 1 <= traj.num_turns < 20, traj.metadata
  assert traj.num_tokens <= budget


def test_bash_only_needs_a_bash_tool(tokenizer):
  env = envs.make("number_search", n=16)
  traj = asyncio.run(harnesses.get("bash_only").run_episode(
      TextEngine(tokenizer, ["x"]), tokenizer, env, env.tasks("train", 1, 0)[0], SamplingParams(),
      agent.EpisodeLimits()))
  assert traj.status == Status.ENV_ERROR and "needs an environment with a 'bash' tool" in traj.metadata["error"]


def test_editor_as_bash_has_the_editor_effect(calc_dataset):
  env = _env(calc_dataset)
  env.reset(env.task_pool()[0])
  try:
    for arguments in ({"command": "str_replace", "path": "/testbed/calc/ops.py", "old_str": CALC_FIX["old"],
                       "new_str": CALC_FIX["new"]},
                      {"command": "insert", "path": "/testbed/calc/ops.py", "insert_line": 0, "new_str": "# top"},
                      {"command": "create", "path": "/testbed/notes.txt", "file_text": "a 'quoted' \"text\"\n"}):
      observation, _ = env.step(ToolCall("bash", {"command": bash_only.editor_as_bash(
          ToolCall("str_replace_editor", arguments))}))
      assert "[exit code" not in observation, observation
    ops, _ = env.step(ToolCall("bash", {"command": "cat calc/ops.py notes.txt"}))
    assert ops.startswith("# top\n") and "return hi\n    return x" in ops and "a 'quoted' \"text\"" in ops
    view, _ = env.step(ToolCall("bash", {"command": bash_only.editor_as_bash(ToolCall(
        "str_replace_editor", {"command": "view", "path": "/testbed/calc/ops.py", "view_range": [1, 2]}))}))
    assert view.split("\n")[0].strip().startswith("1") and len(view.strip().split("\n")) == 2, view
  finally:
    env.close()
