"""Tests for the assistant-turn tool-call text format."""
import hypothesis
from hypothesis import strategies as st
import pytest

from sao.rollout import tool_format
from sao.rollout.tool_format import ToolCall, ToolCallError, ToolCallErrorCode, parse_tool_call

TOOLS = [
    tool_format.function_tool("compare", "Compare.", {"guess": {"type": "integer"}}),
    tool_format.function_tool("edit", "Edit.", {"line": {"type": "integer"}, "text": {"type": "string"}}),
    tool_format.function_tool("submit", "Submit."),
]


def test_format_is_qwen_style_single_line():
  text = tool_format.format_tool_call(ToolCall("compare", {"guess": 32}))
  assert text == '<tool_call>{"name": "compare", "arguments": {"guess": 32}}</tool_call>'


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "compare", "arguments": {"guess": 32}}</tool_call>',
    '<tool_call>\n{"name": "compare", "arguments": {"guess": 32}}\n</tool_call>',  # Qwen's template layout
    'I will guess the middle. <tool_call>{"name": "compare", "arguments": {"guess": 32}}</tool_call>\n',
    '<tool_call>{"name": "compare", "arguments": "{\\"guess\\": 32}"}</tool_call>',  # OpenAI-style string args
])
def test_parse_accepts_valid_layouts(text):
  assert parse_tool_call(text, TOOLS) == ToolCall("compare", {"guess": 32})


def test_parse_without_tools_accepts_any_name_and_missing_arguments():
  assert parse_tool_call('<tool_call>{"name": "anything"}</tool_call>') == ToolCall("anything", {})


@pytest.mark.parametrize("text,code", [
    ("just text", ToolCallErrorCode.NO_TOOL_CALL),
    ("", ToolCallErrorCode.NO_TOOL_CALL),
    ('<tool_call>{"name": "compare", "arguments": {"guess": 3', ToolCallErrorCode.UNTERMINATED),
    ('<tool_call>{"name": "submit"}</tool_call><tool_call>{"name": "submit"}</tool_call>',
     ToolCallErrorCode.MULTIPLE_CALLS),
    ("<tool_call>{name: compare}</tool_call>", ToolCallErrorCode.INVALID_JSON),
    ("<tool_call></tool_call>", ToolCallErrorCode.INVALID_JSON),
    ('<tool_call>{"name": "compare", "arguments": "{bad"}</tool_call>', ToolCallErrorCode.INVALID_JSON),
    ("<tool_call>[1, 2]</tool_call>", ToolCallErrorCode.BAD_STRUCTURE),
    ('<tool_call>{"name": 3}</tool_call>', ToolCallErrorCode.BAD_STRUCTURE),
    ('<tool_call>{"name": "compare", "arguments": [32]}</tool_call>', ToolCallErrorCode.BAD_STRUCTURE),
    ('<tool_call>{"name": "compare", "arguments": {}, "x": 1}</tool_call>', ToolCallErrorCode.BAD_STRUCTURE),
    ('<tool_call>{"name": "delete_all", "arguments": {}}</tool_call>', ToolCallErrorCode.UNKNOWN_TOOL),
    ('<tool_call>{"name": "compare", "arguments": {}}</tool_call>', ToolCallErrorCode.BAD_ARGUMENTS),
    ('<tool_call>{"name": "compare", "arguments": {"guess": "32"}}</tool_call>', ToolCallErrorCode.BAD_ARGUMENTS),
    ('<tool_call>{"name": "compare", "arguments": {"guess": true}}</tool_call>', ToolCallErrorCode.BAD_ARGUMENTS),
    ('<tool_call>{"name": "compare", "arguments": {"guess": 1.5}}</tool_call>', ToolCallErrorCode.BAD_ARGUMENTS),
    ('<tool_call>{"name": "compare", "arguments": {"guess": 1, "y": 2}}</tool_call>',
     ToolCallErrorCode.BAD_ARGUMENTS),
])
def test_parse_errors_are_returned_not_raised(text, code):
  result = parse_tool_call(text, TOOLS)
  assert isinstance(result, ToolCallError)
  assert result.code is code
  assert result.observation.startswith("error: ")
  assert len(result.observation) < 80  # observations stay short for the toy models


def test_unknown_tool_with_plain_names():
  result = parse_tool_call('<tool_call>{"name": "x", "arguments": {}}</tool_call>', ["compare"])
  assert isinstance(result, ToolCallError) and result.code is ToolCallErrorCode.UNKNOWN_TOOL


def test_function_tool_schema_shape():
  schema = TOOLS[1]
  assert schema["type"] == "function"
  assert schema["function"]["name"] == "edit"
  assert schema["function"]["parameters"]["required"] == ["line", "text"]
  assert tool_format.tool_names(TOOLS) == ["compare", "edit", "submit"]


_json_scalars = st.one_of(st.integers(-10**6, 10**6), st.text(max_size=20), st.booleans(), st.none(),
                          st.floats(allow_nan=False, allow_infinity=False))


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(st.text(min_size=1, max_size=12), st.dictionaries(st.text(max_size=8), _json_scalars, max_size=4),
                  st.text(max_size=30).filter(lambda s: "<tool_call>" not in s))
def test_format_parse_round_trip(name, arguments, prefix):
  call = ToolCall(name, arguments)
  assert parse_tool_call(prefix + tool_format.format_tool_call(call)) == call


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.text(max_size=80))
def test_parse_never_raises_on_arbitrary_text(text):
  result = parse_tool_call(text, TOOLS)
  assert isinstance(result, (ToolCall, ToolCallError))


def test_tags_inside_arguments_are_escaped():
  call = ToolCall("edit", {"line": 1, "text": 'x = "</tool_call><tool_call>"'})
  text = tool_format.format_tool_call(call)
  assert text.count("</tool_call>") == 1
  assert parse_tool_call(text, TOOLS) == call
