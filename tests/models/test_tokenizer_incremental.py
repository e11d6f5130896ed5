"""The agent loop's cheaper rendering: incremental ids equal full renderings on random conversations, memoised
template constants stay per template, and the fast message copy is a deep copy."""
from __future__ import annotations

import copy
import random

import pytest

from sao.models import chat_template
from sao.models.tokenizer import Tokenizer, toy_tokenizer

TOOLS = [{"type": "function", "function": {
    "name": "compare", "description": "Compare a guess with the hidden number.",
    "parameters": {"type": "object", "properties": {"guess": {"type": "integer"}}, "required": ["guess"]}}}]
WORDS = ["higher", "lower", "equal", "1..16", "<tool_call>", '{"guess": 7}', "</tool_call>", "é✓", " ", "\n", "x"]


@pytest.fixture(scope="module")
def toy():
  return toy_tokenizer()


def _random_text(rng: random.Random) -> str:
  return "".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))


def _random_conversation(rng: random.Random) -> list[dict]:
  chat = [{"role": "system", "content": _random_text(rng)}, {"role": "user", "content": _random_text(rng)}]
  for _ in range(rng.randint(1, 6)):
    chat.append({"role": "assistant", "content": _random_text(rng)})
    chat.append({"role": "tool", "content": _random_text(rng)})
  return chat


def test_incremental_ids_equal_full_rendering_on_random_conversations(toy):
  """Prompt ids + each later message's `render_message_ids` == the ids of the whole conversation, for 40 random
  conversations with and without tools (what the agent loop relies on)."""
  rng = random.Random(0)
  for _ in range(40):
    chat = _random_conversation(rng)
    tools = rng.choice([None, TOOLS])
    ids = toy.apply_chat_template(chat[:2], tools, add_generation_prompt=False)
    for k in range(2, len(chat)):
      last = k == len(chat) - 1
      ids += toy.render_message_ids(chat[k], history=chat[:k], tools=tools, add_generation_prompt=last)
    assert ids == toy.apply_chat_template(chat, tools, add_generation_prompt=True)
    assert toy.render_suffix(chat[:-1], chat[-1:], tools, True) == (
        toy.render_chat(chat, tools, True)[len(toy.render_chat(chat[:-1], tools, False)):])


def test_template_constants_are_memoised_per_template_and_kwargs(toy):
  gen, end = toy.generation_prompt_ids(), toy.assistant_end_ids()
  assert toy.decode(gen) == "<|im_start|>assistant\n" and toy.decode(end) == "\n"
  gen.append(-1)  # callers get their own list: the memo cannot be changed through it
  assert toy.generation_prompt_ids() == gen[:-1]
  # Another template on the same vocabulary gets its own answer, not the first template's.
  other = Tokenizer(toy.backend, toy.config, toy.chat_templates["default"].replace(
      "'<|im_start|>assistant\\n'", "'<|im_start|>assistant\\nA: '"), toy.generation_config)
  assert other.decode(other.generation_prompt_ids()) == "<|im_start|>assistant\nA: "
  assert toy.decode(toy.generation_prompt_ids()) == "<|im_start|>assistant\n"
  # A template variable is part of the key; the explicit-history form is computed as before.
  tvar = Tokenizer(toy.backend, toy.config, "{% for m in messages %}{{ m.content }}{% endfor %}"
                   "{% if add_generation_prompt %}{{ prefix }}<|im_start|>assistant\n{% endif %}",
                   toy.generation_config)
  assert tvar.decode(tvar.generation_prompt_ids(prefix="P")) == "P<|im_start|>assistant\n"
  assert tvar.decode(tvar.generation_prompt_ids(prefix="Q")) == "Q<|im_start|>assistant\n"
  assert toy.generation_prompt_ids(history=[{"role": "user", "content": "hi"}], tools=TOOLS) == gen[:-1]


def test_plain_copy_is_a_deep_copy():
  value = {"a": [1, 2.5, {"b": ("x", None, True)}], "c": "s", 3: [[]]}
  out = chat_template.plain_copy(value)
  assert out == copy.deepcopy(value) and out is not value
  assert isinstance(out["a"][2]["b"], tuple)
  out["a"][2]["k"] = 1
  out[3][0].append(1)
  assert "k" not in value["a"][2] and value[3] == [[]]

  class Obj:
    def __init__(self):
      self.items = [1]

  obj = Obj()
  copied = chat_template.plain_copy({"o": obj})["o"]  # not JSON-like: copy.deepcopy's copy
  assert copied is not obj and copied.items == [1] and copied.items is not obj.items
