"""Tokenizer + chat template: parity with transformers' apply_chat_template, the toy tokenizer, incremental ids."""
from __future__ import annotations

import json
import os

import pytest
import transformers

from sao.models import toy_vocab
from sao.models.tokenizer import ChatTemplateError, TemplatePrefixError, Tokenizer, toy_tokenizer

TOOLS = [{
    "type": "function",
    "function": {
        "name": "compare",
        "description": "Compare a guess with the secret number.",
        "parameters": {"type": "object", "properties": {"guess": {"type": "integer"}}, "required": ["guess"]},
    },
}]

TOY_TEXTS = [
    "Find the number in 1..64.",
    '<tool_call>{"name": "compare", "arguments": {"guess": 32}}</tool_call>',
    "higher", "lower", "equal",
    "def add(a, b):\n    return a - b\n\n\ndef test_add():\n    assert add(2, 3) == 5\n    assert add(-1, 1) == 0\n",
    "Traceback (most recent call last):\n  File \"main.py\", line 7\nAssertionError: expected 5, got -1",
    "  leading and trailing spaces \t\r\n", "héllo wörld 日本語 🎉 <pad> <|im_end|>", "",
]

# A conversation with every role: system, user, assistant tool calls (dict and JSON-string arguments), tool results.
CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Find the number in 1..64."},
    {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "compare", "arguments": {"guess": 32}}}]},
    {"role": "tool", "content": "higher"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"type": "function", "function": {"name": "compare", "arguments": '{"guess": 48}'}}]},
    {"role": "tool", "content": "lower"},
    {"role": "assistant", "content": "The number is 40."},
]

# A hand-written Qwen-style template: tools listed in <tools>, calls in <tool_call> blocks, consecutive tool
# results grouped into one user turn.
QWEN_STYLE_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
{{- '\\n\\n# Tools\\n\\nYou may call functions. Signatures:\\n<tools>' }}
{%- for tool in tools %}
{{- '\\n' + (tool | tojson) }}
{%- endfor %}
{{- '\\n</tools>\\n\\nReturn each call as <tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
  {%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
  {%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
    {%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
    {%- for call in message.tool_calls %}
      {%- if call.function is defined %}{%- set call = call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' + call.name + '", "arguments": ' }}
      {%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
    {%- endfor %}
{{- '<|im_end|>\\n' }}
  {%- elif message.role == 'tool' %}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


def hf_ids(hf_tok, messages, tools=None, add_generation_prompt=True, **kwargs):
  return list(hf_tok.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                         tokenize=True, return_dict=False, **kwargs))


@pytest.fixture(scope="module")
def toy():
  return toy_tokenizer()


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory, toy):
  return toy.save_pretrained(str(tmp_path_factory.mktemp("toy_tokenizer")))


@pytest.fixture(scope="module")
def smol(smollm2_dir):
  return Tokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def hf_smol(smollm2_dir):
  return transformers.AutoTokenizer.from_pretrained(smollm2_dir)


# ---- the toy tokenizer ----------------------------------------------------------------------------------------------


def test_toy_vocabulary(toy):
  assert toy.vocab_size < 700  # small: the toy models are ~100k parameters
  for i, t in enumerate(toy_vocab.TOY_SPECIAL_TOKENS):
    assert toy.token_to_id(t) == i
    assert toy.encode(t) == [i]
  assert toy.eos_token_ids == (toy.token_to_id("<|im_end|>"),)
  assert toy.pad_token_id == toy.token_to_id("<pad>")
  assert toy.bos_token_id is None


@pytest.mark.parametrize("text", TOY_TEXTS)
def test_toy_round_trip(toy, text):
  assert toy.decode(toy.encode(text)) == text


def test_toy_is_compact(toy):
  for word in ("higher", "lower", "equal", "compare", "guess", "assistant"):
    assert len(toy.encode(word)) == 1, word
  # Whole numbers 10..128 are one piece each (a guess is one decision token); others are spelt with the fewest pieces.
  assert [toy.decode([i]) for i in toy.encode("7 64 128")] == ["7", " ", "64", " ", "128"]
  assert len(toy.encode("1024")) == 2 and toy.decode(toy.encode("1024")) == "1024"
  call = toy.encode('<tool_call>{"name": "compare", "arguments": {"guess": 32}}</tool_call>')
  assert len(call) <= 10
  assert len(toy.encode("Find the number in 1..64.")) <= 9
  code = TOY_TEXTS[5]
  assert len(toy.encode(code)) < len(code) / 2


def test_toy_is_deterministic(toy):
  """Two builds give identical tokenizer.json (ids must never drift between runs)."""
  assert toy_tokenizer().backend.to_str() == toy.backend.to_str()


def test_toy_saved_directory_loads_like_a_real_one(toy, toy_dir):
  assert sorted(os.listdir(toy_dir)) == ["generation_config.json", "tokenizer.json", "tokenizer_config.json"]
  loaded = Tokenizer.from_pretrained(toy_dir)
  for text in TOY_TEXTS:
    assert loaded.encode(text) == toy.encode(text)
  assert loaded.render_chat(CHAT, TOOLS) == toy.render_chat(CHAT, TOOLS)
  assert loaded.eos_token_ids == toy.eos_token_ids


def test_toy_matches_transformers(toy, toy_dir):
  hf = transformers.AutoTokenizer.from_pretrained(toy_dir)
  assert len(hf) == toy.vocab_size
  for text in TOY_TEXTS:
    assert hf.encode(text, add_special_tokens=False) == toy.encode(text)
    assert hf.decode(toy.encode(text)) == text
  for tools in (None, TOOLS):
    for n in (2, 4, len(CHAT)):
      for agp in (True, False):
        assert toy.apply_chat_template(CHAT[:n], tools, agp) == hf_ids(hf, CHAT[:n], tools, agp)


def test_toy_template_renders_tool_turns(toy):
  text = toy.render_chat(CHAT, TOOLS, add_generation_prompt=False)
  assert ('<|im_start|>assistant\n<tool_call>{"name": "compare", "arguments": {"guess": 32}}</tool_call>'
          '<|im_end|>\n') in text
  assert "<|im_start|>tool\n<tool_response>higher</tool_response><|im_end|>\n" in text
  assert text.startswith("<|im_start|>system\nYou are a helpful assistant.\n\nTools:\n{\"name\": \"compare\"")
  assert text.count("<|im_start|>system") == 1
  with pytest.raises(ChatTemplateError, match="only allowed first"):
    toy.render_chat(CHAT[1:2] + CHAT[:1])
  with pytest.raises(ChatTemplateError, match="Unknown role"):
    toy.render_chat([{"role": "robot", "content": "x"}])


# ---- incremental ids (agent loops) ----------------------------------------------------------------------------------


def test_toy_incremental_ids_extend_the_conversation(toy):
  """prompt ids + each new message's template ids == the whole conversation's ids, for every prefix."""
  for tools in (None, TOOLS):
    for k in range(1, len(CHAT)):
      before = toy.apply_chat_template(CHAT[:k], tools, add_generation_prompt=False)
      for agp in (True, False):
        new = toy.render_message_ids(CHAT[k], history=CHAT[:k], tools=tools, add_generation_prompt=agp)
        assert before + new == toy.apply_chat_template(CHAT[:k + 1], tools, agp)


def test_agent_loop_token_accounting(toy):
  """The agent loop's token sequence (prompt, sampled ids + stop, template end, observation + generation prompt)
  equals the template rendering of the finished conversation, without re-tokenising the sampled ids."""
  prompt = CHAT[:2]
  ids = toy.apply_chat_template(prompt, TOOLS)
  sampled_text = '<tool_call>{"name": "compare", "arguments": {"guess": 32}}</tool_call>'
  ids += toy.encode(sampled_text) + [toy.eos_token_ids[0]]
  ids += toy.assistant_end_ids()
  observation = {"role": "tool", "content": "higher"}
  ids += toy.render_message_ids(observation)
  assert toy.render_message_ids(observation) == toy.render_message_ids(observation, history=prompt, tools=TOOLS)
  full = prompt + [{"role": "assistant", "content": sampled_text}, observation]
  assert ids == toy.apply_chat_template(full, TOOLS)
  assert toy.decode(toy.generation_prompt_ids()) == "<|im_start|>assistant\n"
  assert toy.decode(toy.assistant_end_ids()) == "\n"


def test_prefix_violation_is_an_error(smol):
  qwen = Tokenizer(smol.backend, smol.config, QWEN_STYLE_TEMPLATE)
  # Consecutive tool results share one user turn: the first one's closing <|im_end|> moves when a second arrives.
  with pytest.raises(TemplatePrefixError, match="re-renders earlier turns"):
    qwen.render_message_ids(CHAT[3], history=CHAT[:4], tools=TOOLS)
  # A single tool result after an assistant turn is a clean extension.
  ids = qwen.render_message_ids(CHAT[3], history=CHAT[:3], tools=TOOLS)
  assert qwen.apply_chat_template(CHAT[:3], TOOLS, False) + ids == qwen.apply_chat_template(CHAT[:4], TOOLS)


# ---- real tokenizers: parity with transformers ----------------------------------------------------------------------


def test_smollm2_chat_template_matches_transformers(smol, hf_smol):
  chats = [
      [{"role": "user", "content": "What is the capital of France?"}],
      [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 123!"},
       {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "naïve café ✓"}],
  ]
  for chat in chats:
    for agp in (True, False):
      assert smol.render_chat(chat, add_generation_prompt=agp) == hf_smol.apply_chat_template(
          chat, tokenize=False, add_generation_prompt=agp)
      assert smol.apply_chat_template(chat, add_generation_prompt=agp) == hf_ids(hf_smol, chat, None, agp)
  assert smol.eos_token_ids == (2,) and smol.bos_token_id == 1
  assert smol.special_tokens_map == hf_smol.special_tokens_map
  # ChatML: the template writes "\n" after the <|im_end|> the model stops on.
  assert smol.decode(smol.assistant_end_ids()) == "\n"


def test_qwen_style_template_with_tools_matches_transformers(smol, tmp_path):
  qwen = Tokenizer(smol.backend, smol.config, QWEN_STYLE_TEMPLATE)
  path = qwen.save_pretrained(str(tmp_path / "qwen_style"))
  hf = transformers.AutoTokenizer.from_pretrained(path)
  assert Tokenizer.from_pretrained(path).chat_templates == {"default": QWEN_STYLE_TEMPLATE}
  for tools in (None, TOOLS):
    for n in (2, 3, 4, 6, len(CHAT)):
      for agp in (True, False):
        text = qwen.render_chat(CHAT[:n], tools, agp)
        assert text == hf.apply_chat_template(CHAT[:n], tools=tools, tokenize=False, add_generation_prompt=agp)
        assert qwen.apply_chat_template(CHAT[:n], tools, agp) == hf_ids(hf, CHAT[:n], tools, agp)
  text = qwen.render_chat(CHAT, TOOLS)
  assert '<tool_call>\n{"name": "compare", "arguments": {"guess": 48}}\n</tool_call>' in text
  assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in text


def test_template_environment_matches_transformers(smol, tmp_path):
  """The environment's extras: tojson without HTML escaping and with options, strftime_now, loop controls,
  raise_exception, special tokens as variables, caller kwargs."""
  template = ("{{ messages[0].content | tojson }}|{{ {'b': 1, 'a': [1, 2]} | tojson(indent=2, sort_keys=True) }}|"
              "{{ strftime_now('%Y') | length }}|{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
              "{{ m.role }}{% endfor %}|{{ bos_token }}{{ eos_token }}|{{ flag }}"
              "{% if messages | length > 2 %}{{ raise_exception('too many') }}{% endif %}")
  tok = Tokenizer(smol.backend, smol.config, template)
  hf = transformers.AutoTokenizer.from_pretrained(tok.save_pretrained(str(tmp_path / "env")))
  chat = [{"role": "user", "content": "<a & 'b'>"}, {"role": "assistant", "content": "x"}]
  assert tok.render_chat(chat, flag=7) == hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=True,
                                                                 flag=7)
  assert tok.render_chat(chat).startswith('"<a & \'b\'>"|{\n  "a": [')
  with pytest.raises(ChatTemplateError, match="too many"):
    tok.render_chat(chat * 2)


# ---- errors ---------------------------------------------------------------------------------------------------------


def test_missing_files_and_templates_are_named(tmp_path, smol):
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    Tokenizer.from_pretrained(str(tmp_path))
  bare = Tokenizer(smol.backend, {"eos_token": "<|im_end|>"})
  with pytest.raises(ChatTemplateError, match="no chat template"):
    bare.render_chat([{"role": "user", "content": "x"}])
  with pytest.raises(ValueError, match="not in the vocabulary"):
    Tokenizer(smol.backend, {"eos_token": "<nonexistent>"})


def test_chat_template_jinja_file_wins(toy, tmp_path):
  path = toy.save_pretrained(str(tmp_path / "tok"))
  with open(os.path.join(path, "chat_template.jinja"), "w", encoding="utf-8") as f:
    f.write("{% for m in messages %}[{{ m.content }}]{% endfor %}")
  assert Tokenizer.from_pretrained(path).render_chat([{"role": "user", "content": "hi"}]) == "[hi]"
