"""Harnesses: each tool syntax round-trips (format → parse), tokenizes compactly in the toy vocab, plays expert
episodes through the agent loop, yields demonstrations in its own format; the mixture picks at its weights."""
from __future__ import annotations

import asyncio
import collections
import json

import numpy as np
import pytest

from sao.models.tokenizer import toy_tokenizer
from sao.rollout import envs, harnesses, tool_format
from sao.rollout.demonstrations import demonstration_to_trajectory, demonstration_trajectories
from sao.rollout.harnesses import expert, syntaxes
from sao.rollout.tool_format import ToolCall, ToolCallError, ToolCallErrorCode

SYNTAXES = ("xml_json", "json_block", "function_call")
TOOLS = [
    tool_format.function_tool("compare", "Compare.", {"guess": {"type": "integer"}}),
    tool_format.function_tool("edit", "Edit.", {"line": {"type": "integer"}, "text": {"type": "string"}}),
    tool_format.function_tool("put", "Put.", {"value": {"type": "object"}, "flag": {"type": "boolean"}},
                              required=["value"]),
]
CALLS = [
    ToolCall("compare", {"guess": 12}),
    ToolCall("compare", {"guess": -3}),
    ToolCall("edit", {"line": 2, "text": "  return x  # `fence` ``` </tool_call> \"q\" 'a'\n\tnext"}),
    ToolCall("put", {"value": {"a": [1, 2.5, None, "x"]}, "flag": True}),
    ToolCall("put", {"value": {}}),
]


@pytest.fixture(scope="module")
def tokenizer():
  return toy_tokenizer()


@pytest.mark.parametrize("name", SYNTAXES)
@pytest.mark.parametrize("call", CALLS, ids=lambda c: f"{c.name}{len(c.arguments)}")
def test_syntax_round_trips(name, call):
  harness = harnesses.get(name)
  text = harness.format_text(call)
  assert harness.parse_call(text, TOOLS) == call
  assert harness.parse_call("Reasoning first.\n" + text + "\n", TOOLS) == call


@pytest.mark.parametrize("name, text, code", [
    ("json_block", "no call here", ToolCallErrorCode.NO_TOOL_CALL),
    ("json_block", '```json\n{"name": "compare", "arguments": {"guess": 1}}', ToolCallErrorCode.UNTERMINATED),
    ("json_block", '```json\n{"name": "compare"\n```', ToolCallErrorCode.INVALID_JSON),
    ("json_block", '```json\n{"name": "nope", "arguments": {}}\n```', ToolCallErrorCode.UNKNOWN_TOOL),
    ("json_block", "```json\n{\"name\": \"compare\", \"arguments\": {\"guess\": 1}}\n```\n```json\n"
                   "{\"name\": \"compare\", \"arguments\": {\"guess\": 2}}\n```", ToolCallErrorCode.MULTIPLE_CALLS),
    ("json_block", '```json\n{"name": "compare", "arguments": {"guess": "x"}}\n```', ToolCallErrorCode.BAD_ARGUMENTS),
    ("function_call", "no call here", ToolCallErrorCode.NO_TOOL_CALL),
    ("function_call", "compare(guess=1) compare(guess=2)", ToolCallErrorCode.MULTIPLE_CALLS),
    ("function_call", "compare(1)", ToolCallErrorCode.BAD_ARGUMENTS),
    ("function_call", "compare(guess=x)", ToolCallErrorCode.BAD_ARGUMENTS),
    ("function_call", "compare(guess=1", ToolCallErrorCode.BAD_STRUCTURE),
    ("function_call", "nope(guess=1)", ToolCallErrorCode.UNKNOWN_TOOL),
    ("function_call", "compare(guess=True)", ToolCallErrorCode.BAD_ARGUMENTS),
    ("xml_json", "<tool_call>{}", ToolCallErrorCode.UNTERMINATED),
])
def test_malformed_calls_are_errors_not_exceptions(name, text, code):
  result = harnesses.get(name).parse_call(text, TOOLS)
  assert isinstance(result, ToolCallError) and result.code == code, result
  assert result.observation.startswith("error: ")


@pytest.mark.parametrize("name", SYNTAXES)
def test_number_search_episode_tokenizes_compactly(name, tokenizer):
  """The toy vocab covers every syntax: exact round trip, a short prompt, and a call of a few tokens."""
  env = envs.make("number_search", n=16)
  harness = harnesses.get(name)
  messages, tools = harness.present(env.reset(env.tasks("train", 1, 0)[0]), env.tool_schemas)
  prompt = tokenizer.render_chat(messages, tools=tools)
  assert tokenizer.decode(tokenizer.encode(prompt)) == prompt
  assert len(tokenizer.encode(prompt)) <= 30, [tokenizer.decode([i]) for i in tokenizer.encode(prompt)]
  call_text = harness.format_text(ToolCall("compare", {"guess": 12}))
  assert tokenizer.decode(tokenizer.encode(call_text)) == call_text
  assert len(tokenizer.encode(call_text)) <= 5, [tokenizer.decode([i]) for i in tokenizer.encode(call_text)]
  if name != "xml_json":  # the template's tools header would teach the other syntax
    assert tools is None and "<tool_call>" not in prompt


@pytest.mark.parametrize("call", CALLS, ids=lambda c: f"{c.name}{len(c.arguments)}")
def test_xml_json_system_round_trips_and_reads_smollm2_lists(call):
  harness = harnesses.get("xml_json_system")
  text = harness.format_text(call)
  assert text == tool_format.format_tool_call(call)
  assert harness.parse_call("Reasoning first.\n" + text + "\n", TOOLS) == call
  inner = text.removeprefix(tool_format.OPEN_TAG).removesuffix(tool_format.CLOSE_TAG)  # the escaped JSON object
  listed = f"{tool_format.OPEN_TAG}[{inner}]{tool_format.CLOSE_TAG}"
  assert harness.parse_call(listed, TOOLS) == call


@pytest.mark.parametrize("text, code", [
    ("no call here", ToolCallErrorCode.NO_TOOL_CALL),
    ("<tool_call>[]</tool_call>", ToolCallErrorCode.BAD_STRUCTURE),
    ("<tool_call>[1]</tool_call>", ToolCallErrorCode.BAD_STRUCTURE),
    ('<tool_call>[{"name": "compare", "arguments": {"guess": 1}}, {"name": "compare", "arguments": {"guess": 2}}]'
     "</tool_call>", ToolCallErrorCode.MULTIPLE_CALLS),
    ('<tool_call>[{"name": "nope", "arguments": {}}]</tool_call>', ToolCallErrorCode.UNKNOWN_TOOL),
    ('<tool_call>{"name": "compare", "arguments": [1]}</tool_call>', ToolCallErrorCode.BAD_STRUCTURE),
    ('</tool_call> <tool_call>[{"name": "compare", "arguments": {"guess": "x"}}]</tool_call>',
     ToolCallErrorCode.BAD_ARGUMENTS),
    ("<tool_call>{}", ToolCallErrorCode.UNTERMINATED),
])
def test_xml_json_system_errors(text, code):
  result = harnesses.get("xml_json_system").parse_call(text, TOOLS)
  assert isinstance(result, ToolCallError) and result.code == code, result


def test_xml_json_system_lists_the_tools_in_the_system_message(tokenizer):
  """For templates without a tools header (SmolLM2's): the template gets no tools, the system message lists them."""
  env = envs.make("number_search", n=16)
  messages, tools = harnesses.get("xml_json_system").present(env.reset(env.tasks("train", 1, 0)[0]),
                                                             env.tool_schemas)
  assert tools is None and messages[0]["role"] == "system"
  system = messages[0]["content"]
  assert system.startswith(env.system_prompt) and "<tools>\n" in system and "</tools>" in system
  assert json.dumps(env.tool_schemas[0]["function"]) in system and "<tool_call>" in system
  traj = asyncio.run(expert.demonstrate(harnesses.get("xml_json_system"), env, env.tasks("train", 1, 0)[0],
                                        tokenizer))
  assert traj.reward == 1.0 and traj.harness == "xml_json_system"


def test_function_call_signatures():
  assert syntaxes.signature(TOOLS[2]) == "put(value: object, flag?: boolean) - Put."


@pytest.mark.parametrize("name", SYNTAXES)
@pytest.mark.parametrize("env_name, kwargs", [("number_search", {"n": 16}), ("code_repair", {})])
def test_expert_solves_through_every_syntax(name, env_name, kwargs, tokenizer):
  env = envs.make(env_name, **kwargs)
  for task in env.tasks("train", 3, seed=1):
    traj = asyncio.run(expert.demonstrate(harnesses.get(name), env, task, tokenizer))
    traj.validate(tokenizer.vocab_size)
    assert traj.harness == name and traj.reward == 1.0 and traj.status == "ok"
    assert "error:" not in tokenizer.decode(traj.token_ids.tolist())


@pytest.mark.parametrize("env_name, kwargs", [("number_search", {"n": 16}), ("code_repair", {})])
def test_xml_json_demonstrations_equal_the_template_format_ones(env_name, kwargs, tokenizer):
  env = envs.make(env_name, **kwargs)
  task = env.tasks("train", 1, seed=3)[0]
  legacy = demonstration_to_trajectory(env.demonstrate(task, np.random.default_rng(0), noise=0.3), tokenizer,
                                       env.tool_schemas)
  played = asyncio.run(expert.demonstrate(harnesses.get("xml_json"), env, task, tokenizer,
                                          np.random.default_rng(0), noise=0.3))
  np.testing.assert_array_equal(played.token_ids, legacy.token_ids)
  np.testing.assert_array_equal(played.action_mask, legacy.action_mask)
  assert played.reward == legacy.reward


def test_demonstrations_cover_every_harness(tokenizer):
  trajs = demonstration_trajectories("number_search", tokenizer, 30, seed=1, noise=0.2, env_kwargs={"n": 16},
                                     harnesses=SYNTAXES)
  counts = collections.Counter(t.harness for t in trajs)
  assert set(counts) == set(SYNTAXES) and min(counts.values()) >= 5, counts
  for t in trajs:
    t.validate(tokenizer.vocab_size)
    text = tokenizer.decode(t.token_ids[t.action_mask].tolist())
    marker = {"xml_json": "<tool_call>", "json_block": "```json", "function_call": "compare(guess="}[t.harness]
    assert marker in text
  again = demonstration_trajectories("number_search", tokenizer, 30, seed=1, noise=0.2, env_kwargs={"n": 16},
                                     harnesses=SYNTAXES)
  assert [t.harness for t in again] == [t.harness for t in trajs]
  assert all(np.array_equal(a.token_ids, b.token_ids) for a, b in zip(again, trajs))


def test_mixture_picks_at_the_weights():
  mixture = harnesses.HarnessMixture(SYNTAXES, (1.0, 2.0, 3.0), eval_harness="json_block", seed=7)
  n = 6000
  counts = collections.Counter(mixture.pick(f"e0:task{i}", 0) for i in range(n))
  for name, p in zip(SYNTAXES, mixture.probabilities):
    assert abs(counts[name] - n * p) < 4 * np.sqrt(n * p * (1 - p)), (name, counts)
  assert mixture.pick("e0:task1", 0) == mixture.pick("e0:task1", 0)  # deterministic: re-leases keep the harness
  assert {mixture.pick(f"eval0:t{i}", 0, is_validation=True) for i in range(50)} == {"json_block"}
  zero = harnesses.HarnessMixture(SYNTAXES, (0.0, 1.0, 0.0))
  assert {zero.pick(f"g{i}", 0) for i in range(200)} == {"json_block"}
  assert harnesses.HarnessMixture(("function_call",)).eval_harness == "function_call"


@pytest.mark.parametrize("kw, match", [
    (dict(names=()), "at least one"),
    (dict(names=("xml_json", "nope")), "not a registered harness"),
    (dict(names=("xml_json", "xml_json")), "repeated"),
    (dict(names=SYNTAXES, weights=(1.0, 1.0)), "3 harnesses"),
    (dict(names=SYNTAXES, weights=(1.0, -1.0, 1.0)), "harness_weights"),
    (dict(names=SYNTAXES, weights=(0.0, 0.0, 0.0)), "harness_weights"),
    (dict(names=SYNTAXES, eval_harness="nope"), "not a registered harness"),
])
def test_mixture_errors_name_the_problem(kw, match):
  with pytest.raises(ValueError, match=match):
    harnesses.HarnessMixture(**kw)


def test_openai_tools_scaffold_records_the_agent_loop_stream(tokenizer):
  """Through the proxy, the function-calling scaffold's expert episode is token for token the xml_json agent loop's
  (same template, same calls), up to the final observation the scaffold never sends back."""
  env = envs.make("number_search", n=16)
  for task in env.tasks("train", 2, seed=2):
    loop = asyncio.run(expert.demonstrate(harnesses.get("xml_json"), env, task, tokenizer))
    proxied = asyncio.run(expert.demonstrate(harnesses.get("openai_tools"), env, task, tokenizer))
    assert proxied.harness == "openai_tools" and proxied.reward == 1.0 and proxied.num_turns == loop.num_turns
    n = proxied.num_tokens
    assert 0 < n < loop.num_tokens
    np.testing.assert_array_equal(proxied.token_ids, loop.token_ids[:n])
    np.testing.assert_array_equal(proxied.action_mask, loop.action_mask[:n])
