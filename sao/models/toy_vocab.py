"""The tiny tokenizer and ChatML-style chat template of the toy tasks, built in code (no files, no downloads).

The tokenizer is an ordinary `tokenizers.Tokenizer`, so it loads, saves and renders chats through exactly the path a
real checkpoint's tokenizer does (`sao.models.tokenizer.Tokenizer`), and `transformers.AutoTokenizer` can load a
saved copy:
- ids 0..6: the special tokens (`<|im_start|>`, `<|im_end|>`, `<tool_call>`, `</tool_call>`, `<tool_response>`,
  `</tool_response>`, `<pad>`);
- ids 7..262: the 256 bytes (GPT-2's byte-to-unicode alphabet), so every string round-trips exactly;
- then `TOY_PIECES`: common words, JSON fragments of tool calls, and Python fragments, for compact encodings.
The model is a Unigram model with the same score on every piece, so encoding picks a segmentation with the fewest
tokens (Viterbi). Digits appear only in the whole-number pieces 10..128 (one token each);
other numbers are spelt digit by digit. The ids never change for a given
piece list: do not reorder `TOY_PIECES` (append only) or trained toy checkpoints stop matching.
"""
from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

TOY_SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>",
                      "</tool_response>", "<pad>")

# Multi-character pieces, as plain text. Order fixes their ids (append only). Chosen from the toy environments'
# texts (number_search, code_repair: its 2-space-indented programs, tool schemas and observations) and the tool-call
# JSON that `json.dumps` writes.
TOY_PIECES = (
    # Chat roles and layout.
    "system", "user", "assistant", "tool", "\n\n", "  ",
    # Tool calls and tool schemas.
    '{"name": "', '", "arguments": {"', '", "arguments": {}}', '": ', '", "', '"}', "}}", '{"', '": "', '": {"',
    '": {}', '"]', '["', ", ", ": ", "name", "arguments", "type", "function", "object", "properties",
    "description", "required", "integer", "string", "number", "parameters", "NAME", "ARGS",
    # number_search.
    "Find", " the", " number", " in ", " in", "..", "higher", "lower", "equal", " higher", " lower", " equal",
    "compare", "guess", " guess", "Compare", " hidden", " with", " a", " says", " or", " your", " between",
    # code_repair: tools, observations, prompts.
    "view", "edit", "run_tests", "submit", "line", " line", "text", "ok", "error: ", "timeout: ", " passed",
    "; fail: ", " raised ", ", got ", "SyntaxError", "Error", " while loading", "crashed", " must be in ",
    " must be one line", "Show", "Replace", " one", " of", " program", " numbers", "Run", " tests", "Submit",
    " and", " end", " new", " indentation", "Fix", " bug", " so", " all", " pass", " fails", " its", " it",
    " from", " unexpected indent", " invalid syntax", "NameError", "TypeError", "ZeroDivisionError",
    "IndexError", "ValueError", "RecursionError", " is not defined", " did not finish", "Tools",
    # Prompts and task statements in general.
    "You", " you", " are", " to", " is", " that", " this", " for", " on", " be", " can", " use", " call",
    "Call", " tool", " tools", "The", " answer", " function", " code", " fix", " test", " file", " run",
    " return", " result", " value", " list", " not", " when", " if", " only", " each", " first", " last",
    " helpful", " assistant", " task", " correct",
    # Python (2- and 4-space indentation).
    "def ", "def f(", "return ", "  return ", "    return ", "      return ", "\n  ", "\n    ", "\n      ",
    "    ", "      ", "        ", "for ", "  for ", "    for ", " in range(", "range(", "if ", "  if ",
    "    if ", "elif ", "else:", "  else:", "while ", "  while ", " not ", " and ", " or ", " is ", "None",
    "True", "False", " == ", " != ", " = ", " += ", " -= ", " *= ", " //= ", " + ", " - ", " * ", " / ",
    " // ", " % ", " < ", " > ", " <= ", " >= ", " ** ", "):", "()", "]:", "[i]", "(n)", "(x)", "(xs)",
    "(a, b)", "xs", " x", " xs", " i", " n", " k", " s", "len(", "sum(", "max(", "min(", "abs(", "sorted(",
    "list(", ".append(", "assert ", "pass", "result", "total", "count", "best", " best",
    "  s", "  k", "    s", "    k", "f(",
    "f([", "])", "], ", "xyz", "solution", ".py",
    # Whole constant strings of the number_search episode (system prompt, tools header, the call prefix), so a toy
    # episode is ~100 tokens and the model spends its capacity on the digits that carry the decisions.
    "Find the hidden number. Call compare with a guess; it says higher, lower or equal.",
    "\n\nTools:\n",
    '{"name": "compare", "description": "Compare a guess with the hidden number.", "parameters": {"type": '
    '"object", "properties": {"guess": {"type": "integer", "description": "your guess"}}, "required": ["guess"]}}',
    "\nCall a tool with ", '{"name": NAME, "arguments": ARGS}', '{"name": "compare", "arguments": {"guess": ',
    "Find the number in ", "system\n", "user\n", "assistant\n", "tool\n",
    # Whole numbers 10..128 (number_search's ranges with offsets): one token per guess, so a decision is one sample.
    *(str(i) for i in range(10, 129)),
    # Harness syntaxes (`sao.rollout.harnesses.syntaxes`): fenced blocks, Python-style calls and their tool lists.
    "```json\n", "\n```", "```bash\n", "```", "compare(guess=", "(guess=", ")\n",
    "compare(guess: integer) - Compare a guess with the hidden number.",
    "Call a tool as a Python call: NAME(ARG=VALUE, ...).",
)


def _bytes_to_unicode() -> dict[int, str]:
  """GPT-2's byte → printable character map (the ByteLevel pre-tokenizer's alphabet): printable Latin-1 bytes map
  to themselves, the other 68 to code points from 256 on, in byte order."""
  keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
  out, extra = {}, 0
  for b in range(256):
    if b in keep:
      out[b] = chr(b)
    else:
      out[b] = chr(256 + extra)
      extra += 1
  return out


def _byte_level(text: str, table: dict[int, str]) -> str:
  return "".join(table[b] for b in text.encode("utf-8"))


def build_toy_backend() -> tuple[Tokenizer, dict[str, Any], dict[str, Any]]:
  """Builds the toy `tokenizers.Tokenizer`; returns it with its tokenizer_config and generation_config dicts."""
  table = _bytes_to_unicode()
  if set(table.values()) != set(pre_tokenizers.ByteLevel.alphabet()):
    raise AssertionError("byte-to-unicode table disagrees with tokenizers' ByteLevel alphabet")
  pieces = [_byte_level(p, table) for p in TOY_PIECES]
  if len(set(pieces)) != len(pieces):
    raise AssertionError("TOY_PIECES has duplicates")
  if any(len(p) < 2 for p in pieces):
    raise AssertionError("TOY_PIECES must be multi-byte (single bytes are already tokens)")
  if any(any(ch.isdigit() for ch in p) and not p.isdigit() for p in TOY_PIECES):
    raise AssertionError("TOY_PIECES: digits only in whole-number pieces (other numbers are spelt digit by digit)")
  # Equal scores: the Viterbi segmentation is then one with the fewest pieces. Specials get a score too (the model
  # never sees them: added tokens are split off before it).
  vocab = [(t, -1.0) for t in TOY_SPECIAL_TOKENS]
  vocab += [(table[b], -1.0) for b in range(256)]
  vocab += [(p, -1.0) for p in pieces]
  backend = Tokenizer(models.Unigram(vocab, unk_id=None, byte_fallback=False))
  # No regex split: pieces may span word boundaries (" == ", "):\n"); bytes cover everything, so nothing is unknown.
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  backend.decoder = decoders.ByteLevel()
  backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in TOY_SPECIAL_TOKENS])
  config = {
      "tokenizer_class": "PreTrainedTokenizerFast",
      "eos_token": "<|im_end|>",
      "pad_token": "<pad>",
      "additional_special_tokens": [t for t in TOY_SPECIAL_TOKENS if t not in ("<|im_end|>", "<pad>")],
      "add_bos_token": False,
      "add_eos_token": False,
      "clean_up_tokenization_spaces": False,
      "model_max_length": 8192,
  }
  generation_config = {"eos_token_id": [TOY_SPECIAL_TOKENS.index("<|im_end|>")],
                       "pad_token_id": TOY_SPECIAL_TOKENS.index("<pad>")}
  return backend, config, generation_config


# ChatML with Qwen-style tools: a tools header in the system turn, assistant tool calls as
# `<tool_call>{"name": ..., "arguments": ...}</tool_call>`, each tool result its own `tool` turn wrapped in
# `<tool_response>`. Every message renders independently of the others (only a leading system message merges into the
# tools header), so the rendering of a conversation is a prefix of the rendering of any extension of it.
TOY_CHAT_TEMPLATE = """\
{%- set ns = namespace(skip_first=false) %}
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages and messages[0].role == 'system' %}
{{- messages[0].content + '\\n\\n' }}
{%- set ns.skip_first = true %}
{%- endif %}
{{- 'Tools:\\n' }}
{%- for tool in tools %}
{{- (tool.function if tool.function is defined else tool) | tojson }}
{{- '\\n' }}
{%- endfor %}
{{- 'Call a tool with <tool_call>{"name": NAME, "arguments": ARGS}</tool_call>.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- if not loop.first %}
{{- raise_exception('A system message is only allowed first.') }}
{%- endif %}
{%- if not ns.skip_first %}
{{- '<|im_start|>system\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- elif message.role == 'user' %}
{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' }}
{%- if message.content is defined and message.content %}
{{- message.content }}
{%- endif %}
{%- if message.tool_calls is defined %}
{%- for call in message.tool_calls %}
{%- set fn = call.function if call.function is defined else call %}
{{- '<tool_call>{"name": ' + (fn.name | tojson) + ', "arguments": ' }}
{%- if fn.arguments is string %}
{{- fn.arguments }}
{%- else %}
{{- fn.arguments | tojson }}
{%- endif %}
{{- '}</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>tool\\n<tool_response>' + message.content + '</tool_response><|im_end|>\\n' }}
{%- else %}
{{- raise_exception('Unknown role: ' + message.role) }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
