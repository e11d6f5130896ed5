"""Tokenizer + chat template, loaded from an HF tokenizer directory, rendering chats the way `transformers` does.

`Tokenizer` wraps a `tokenizers.Tokenizer` (from `tokenizer.json`) with the settings of `tokenizer_config.json`
(special tokens, the chat template; `chat_template.jinja` wins if present) and `generation_config.json` (extra stop
ids). Chat templates render in a sandboxed jinja2 environment set up like transformers' own (`trim_blocks`,
`lstrip_blocks`, `raise_exception`, a `tojson` that does not HTML-escape, `strftime_now`, `loopcontrols`), with the
named special tokens (`bos_token`, `eos_token`, ...) as template variables, so `apply_chat_template` gives the same
ids as `transformers.AutoTokenizer(...).apply_chat_template(..., tokenize=True)`.

Incremental rendering for agent loops (never re-tokenise model-generated tokens): `render_message_ids` gives the
template tokens that one or more new messages add after a conversation, `generation_prompt_ids` the tokens that open
the next assistant turn, `assistant_end_ids` what the template writes after the assistant's stop token. They are
computed by rendering `history` and `history + new` and taking the text suffix; this is exact only when the first
rendering is a prefix of the second (true for per-message templates like ChatML and the toy template, false e.g.
for templates that rewrite earlier turns once a new user message arrives), so it is checked on every call and a
`TemplatePrefixError` names the first differing position when it fails. The suffix is tokenised on its own, which
equals the tokenisation in context when the boundary does not merge across tokens (it starts with a special token
in ChatML-style templates); that is checked too, on a short tail of the prefix.

The template environment and the message normalisation are `sao.models.chat_template`'s (its errors are importable
from here too). `toy_tokenizer()` builds the tiny tokenizer of the toy tasks (vocabulary and template in
`sao.models.toy_vocab`); it goes through exactly this class, and `save_pretrained` writes it as an ordinary HF
tokenizer directory.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import tokenizers

from sao.models import toy_vocab
from sao.models.chat_template import (ChatTemplateError, TemplatePrefixError, compile_chat_template,
                                      normalize_messages, plain_copy)

# The named special tokens transformers passes to chat templates (`special_tokens_map`).
SPECIAL_TOKEN_ATTRIBUTES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# A conversation to render new messages after when the caller gives none: it keeps first-message-only template
# logic (a default system prompt, a tools header) out of the rendered suffix.
_DEFAULT_HISTORY = (
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": "A"},
)
# How much of the rendered prefix is re-tokenised to check that the suffix tokenises the same on its own.
_BOUNDARY_TAIL_CHARS = 64


def _token_content(value: Any) -> str | None:
  """A special token in tokenizer_config.json is a string or an AddedToken dict (`{"content": ...}`)."""
  if value is None or isinstance(value, str):
    return value
  if isinstance(value, Mapping) and "content" in value:
    return value["content"]
  raise ValueError(f"cannot read special token {value!r} from tokenizer_config.json")


def _read_json(path: str) -> dict[str, Any]:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


class Tokenizer:
  """A `tokenizers.Tokenizer` plus special tokens and a Jinja chat template (an HF tokenizer directory)."""

  def __init__(self, backend: tokenizers.Tokenizer, config: Mapping[str, Any] | None = None,
               chat_template: str | Mapping[str, str] | None = None,
               generation_config: Mapping[str, Any] | None = None):
    """Args:
      backend: the tokenizer proper (model, pre-tokenizer, decoder, added tokens).
      config: the contents of `tokenizer_config.json` (special tokens, optionally `chat_template`).
      chat_template: a Jinja source, or named templates `{"default": ..., "tool_use": ...}`; overrides `config`'s.
      generation_config: the contents of `generation_config.json` (its `eos_token_id`s are also stop ids).
    """
    self.backend = backend
    self.config = dict(config or {})
    self.generation_config = dict(generation_config or {})
    if chat_template is None:
      chat_template = self.config.get("chat_template")
    if isinstance(chat_template, list):  # tokenizer_config's list form: [{"name": ..., "template": ...}]
      chat_template = {t["name"]: t["template"] for t in chat_template}
    self.chat_templates: dict[str, str] = (
        {} if chat_template is None else
        {"default": chat_template} if isinstance(chat_template, str) else dict(chat_template))
    self._constant_ids_cache: dict[tuple, tuple[int, ...]] = {}  # `_constant_ids`
    for attr in SPECIAL_TOKEN_ATTRIBUTES:
      token = _token_content(self.config.get(attr))
      if token is not None and backend.token_to_id(token) is None:
        raise ValueError(f"tokenizer_config.json's {attr} {token!r} is not in the vocabulary")

  # ---- loading and saving -----------------------------------------------------------------------------------------

  @classmethod
  def from_pretrained(cls, path: str) -> Tokenizer:
    """Loads an HF tokenizer directory: tokenizer.json (required), tokenizer_config.json, chat_template.jinja,
    generation_config.json (optional)."""
    tok_path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(tok_path):
      raise FileNotFoundError(f"no tokenizer.json in {path!r} (only fast-tokenizer directories are supported)")
    backend = tokenizers.Tokenizer.from_file(tok_path)
    config_path = os.path.join(path, "tokenizer_config.json")
    config = _read_json(config_path) if os.path.isfile(config_path) else {}
    template = None
    jinja_path = os.path.join(path, "chat_template.jinja")
    if os.path.isfile(jinja_path):
      with open(jinja_path, encoding="utf-8") as f:
        template = f.read()
    gen_path = os.path.join(path, "generation_config.json")
    gen = _read_json(gen_path) if os.path.isfile(gen_path) else {}
    return cls(backend, config, template, gen)

  def save_pretrained(self, path: str) -> str:
    """Writes tokenizer.json and tokenizer_config.json (with the chat template), and generation_config.json if
    set; returns `path`. The result loads with `Tokenizer.from_pretrained` and `transformers.AutoTokenizer`."""
    os.makedirs(path, exist_ok=True)
    self.backend.save(os.path.join(path, "tokenizer.json"))
    config = dict(self.config)
    config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    if self.chat_templates:
      config["chat_template"] = (self.chat_templates["default"] if list(self.chat_templates) == ["default"] else
                                 [{"name": k, "template": v} for k, v in self.chat_templates.items()])
    files = [("tokenizer_config.json", config)]
    if self.generation_config:
      files.append(("generation_config.json", self.generation_config))
    for name, obj in files:
      with open(os.path.join(path, name), "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
    return path

  # ---- vocabulary and special tokens ------------------------------------------------------------------------------

  @property
  def vocab_size(self) -> int:
    """Number of ids, added tokens included (the embedding needs at least this many rows)."""
    return self.backend.get_vocab_size(with_added_tokens=True)

  def token_to_id(self, token: str) -> int | None:
    return self.backend.token_to_id(token)

  def id_to_token(self, token_id: int) -> str | None:
    return self.backend.id_to_token(token_id)

  @property
  def special_tokens_map(self) -> dict[str, str]:
    """The named special tokens that are set (what templates see as `bos_token`, `eos_token`, ...)."""
    out = {}
    for attr in SPECIAL_TOKEN_ATTRIBUTES:
      token = _token_content(self.config.get(attr))
      if token is not None:
        out[attr] = token
    return out

  def _special_id(self, attr: str) -> int | None:
    token = self.special_tokens_map.get(attr)
    return None if token is None else self.backend.token_to_id(token)

  @property
  def bos_token_id(self) -> int | None:
    return self._special_id("bos_token")

  @property
  def eos_token_id(self) -> int | None:
    return self._special_id("eos_token")

  @property
  def pad_token_id(self) -> int | None:
    """The pad id: `pad_token`, else the eos id (a common convention for decoder-only models)."""
    pad = self._special_id("pad_token")
    return self.eos_token_id if pad is None else pad

  @property
  def eos_token_ids(self) -> tuple[int, ...]:
    """Ids that end an assistant turn: `eos_token` plus generation_config.json's `eos_token_id`(s), in order."""
    ids = [] if self.eos_token_id is None else [self.eos_token_id]
    gen = self.generation_config.get("eos_token_id")
    for i in (gen if isinstance(gen, list) else [] if gen is None else [gen]):
      if int(i) not in ids:
        ids.append(int(i))
    return tuple(ids)

  stop_token_ids = eos_token_ids

  # ---- text <-> ids -----------------------------------------------------------------------------------------------

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    """Token ids of `text`; special tokens written in the text become their ids. No BOS unless asked for (and
    then only what the tokenizer's post-processor adds)."""
    return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    """Text of `ids` (special tokens written out unless skipped)."""
    return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  # ---- chat templates ---------------------------------------------------------------------------------------------

  def get_chat_template(self, tools: Sequence[Any] | None = None) -> str:
    """The template to render with: `tool_use` when tools are given and one exists, else `default`."""
    if not self.chat_templates:
      raise ChatTemplateError("this tokenizer has no chat template (no chat_template in tokenizer_config.json and "
                              "no chat_template.jinja)")
    if tools and "tool_use" in self.chat_templates:
      return self.chat_templates["tool_use"]
    if "default" not in self.chat_templates:
      raise ChatTemplateError(f"no 'default' chat template among {sorted(self.chat_templates)}")
    return self.chat_templates["default"]

  def render_chat(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                  add_generation_prompt: bool = True, **kwargs: Any) -> str:
    """Renders `messages` (OpenAI-style dicts; roles system/user/assistant/tool, assistant `tool_calls`) to text.

    `tools` are JSON schemas (`{"type": "function", "function": {...}}`); extra `kwargs` become template variables
    (e.g. `enable_thinking=False`) and override the special tokens of the same name.
    """
    if tools is not None:
      for tool in tools:
        if not isinstance(tool, Mapping):
          raise TypeError(f"tools must be JSON-schema dicts, got {tool!r}")
      tools = [plain_copy(tool) for tool in tools]
    template = compile_chat_template(self.get_chat_template(tools))
    variables = {**self.special_tokens_map, **kwargs}
    try:
      return template.render(messages=normalize_messages(messages), tools=tools, documents=None,
                             add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.exceptions.TemplateError as e:
      raise ChatTemplateError(f"the chat template failed to render this conversation: {e}") from e

  def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                          tools: Sequence[Mapping[str, Any]] | None = None, add_generation_prompt: bool = True,
                          **kwargs: Any) -> list[int]:
    """Token ids of `render_chat(...)` (no BOS added beyond what the template writes), as transformers does."""
    return self.encode(self.render_chat(messages, tools, add_generation_prompt, **kwargs))

  # ---- incremental rendering (agent loops) ------------------------------------------------------------------------

  def render_suffix(self, history: Sequence[Mapping[str, Any]], new_messages: Sequence[Mapping[str, Any]],
                    tools: Sequence[Mapping[str, Any]] | None = None, add_generation_prompt: bool = True,
                    **kwargs: Any) -> str:
    """The text that rendering `history + new_messages` adds after the rendering of `history` (without a
    generation prompt). Raises `TemplatePrefixError` if the latter is not a prefix of the former."""
    before = self.render_chat(history, tools, add_generation_prompt=False, **kwargs)
    return self._suffix_after(before, history, new_messages, tools, add_generation_prompt, **kwargs)

  def _suffix_after(self, before: str, history: Sequence[Mapping[str, Any]],
                    new_messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
                    add_generation_prompt: bool, **kwargs: Any) -> str:
    """`render_suffix` given `before`, the rendering of `history` (an agent loop renders it once per turn, not
    twice)."""
    after = self.render_chat(list(history) + list(new_messages), tools, add_generation_prompt, **kwargs)
    if not after.startswith(before):
      i = next((k for k, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
      raise TemplatePrefixError(
          f"the chat template re-renders earlier turns when messages are added (renderings differ at character {i}: "
          f"{before[i:i + 40]!r} vs {after[i:i + 40]!r}), so new messages cannot be appended as tokens; "
          "re-render the whole conversation or use a template whose rendering only grows")
    return after[len(before):]

  def _suffix_ids(self, prefix_text: str, suffix: str) -> list[int]:
    """Tokenises `suffix` on its own, checking that it tokenises the same after the end of `prefix_text`."""
    ids = self.encode(suffix)
    tail = prefix_text[-_BOUNDARY_TAIL_CHARS:]
    if tail and suffix and self.encode(tail + suffix) != self.encode(tail) + ids:
      raise TemplatePrefixError(
          f"the template text {suffix[:40]!r} does not start on a token boundary after {tail[-20:]!r}: tokenising "
          "it separately differs from tokenising it in context")
    return ids

  def render_message_ids(self, message: Mapping[str, Any] | Sequence[Mapping[str, Any]],
                         history: Sequence[Mapping[str, Any]] | None = None,
                         tools: Sequence[Mapping[str, Any]] | None = None, add_generation_prompt: bool = True,
                         **kwargs: Any) -> list[int]:
    """Template token ids for one new message (or a list of them) appended after `history`, followed by the
    generation prompt if asked (e.g. a tool observation: `<|im_start|>tool\\n<tool_response>…<|im_end|>\\n
    <|im_start|>assistant\\n`). Without `history`, a neutral system/user/assistant exchange stands in for it."""
    new = [message] if isinstance(message, Mapping) else list(message)
    hist = list(_DEFAULT_HISTORY if history is None else history)
    before = self.render_chat(hist, tools, add_generation_prompt=False, **kwargs)
    suffix = self._suffix_after(before, hist, new, tools, add_generation_prompt, **kwargs)
    return self._suffix_ids(before, suffix)

  def _constant_ids(self, name: str, kwargs: Mapping[str, Any], compute) -> list[int]:
    """`compute()` memoised per (name, template, special tokens, kwargs): the ids depend on nothing else. Calls with
    template variables that are not plain scalars are not memoised (their equality is not reliable)."""
    if any(not isinstance(v, (str, int, float, bool, type(None))) for v in kwargs.values()):
      return compute()
    key = (name, tuple(sorted(self.chat_templates.items())), tuple(sorted(self.special_tokens_map.items())),
           self.eos_token_ids, tuple(sorted((k, type(v).__name__, v) for k, v in kwargs.items())))
    if key not in self._constant_ids_cache:
      self._constant_ids_cache[key] = tuple(compute())
    return list(self._constant_ids_cache[key])

  def generation_prompt_ids(self, history: Sequence[Mapping[str, Any]] | None = None,
                            tools: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any) -> list[int]:
    """Token ids the template adds to open the assistant's turn (e.g. `<|im_start|>assistant\\n`)."""
    if history is None and tools is None:  # the agent loop's per-episode question: answered once per template
      return self._constant_ids("generation_prompt", kwargs,
                                lambda: self._generation_prompt_ids(list(_DEFAULT_HISTORY[:2]), None, **kwargs))
    return self._generation_prompt_ids(list(_DEFAULT_HISTORY[:2] if history is None else history), tools, **kwargs)

  def _generation_prompt_ids(self, hist: list[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
                             **kwargs: Any) -> list[int]:
    before = self.render_chat(hist, tools, add_generation_prompt=False, **kwargs)
    after = self.render_chat(hist, tools, add_generation_prompt=True, **kwargs)
    if not after.startswith(before):
      raise TemplatePrefixError("the chat template's generation prompt rewrites the conversation before it")
    return self._suffix_ids(before, after[len(before):])

  def assistant_end_ids(self, **kwargs: Any) -> list[int]:
    """Template token ids that follow the assistant's stop token at the end of its turn (`\\n` after
    `<|im_end|>` in ChatML; often none). An agent loop appends these (mask 0) after a turn that ended on a stop
    token, before the next message's `render_message_ids`.

    Found by rendering an assistant message with a marker as content: the template text after the marker must begin
    with the text of a stop token; the rest is returned.
    """
    return self._constant_ids("assistant_end", kwargs, lambda: self._assistant_end_ids(**kwargs))

  def _assistant_end_ids(self, **kwargs: Any) -> list[int]:
    marker = "\x00SAO_END\x00"
    hist = list(_DEFAULT_HISTORY[:2])
    text = self.render_chat(hist + [{"role": "assistant", "content": marker}], add_generation_prompt=False, **kwargs)
    if text.count(marker) != 1:
      raise ChatTemplateError("the chat template does not render assistant content verbatim exactly once")
    after = text.split(marker, 1)[1]
    for i in self.eos_token_ids:
      stop = self.decode([i])
      if stop and after.startswith(stop):
        return self._suffix_ids(text[:text.index(marker)] + marker + stop, after[len(stop):])
    raise ChatTemplateError(f"the chat template ends an assistant turn with {after[:40]!r}, which does not start "
                            f"with any stop token ({[self.decode([i]) for i in self.eos_token_ids]})")


def toy_tokenizer() -> Tokenizer:
  """The tiny tokenizer + ChatML-style chat template of the toy tasks (see `sao.models.toy_vocab`)."""
  backend, config, generation_config = toy_vocab.build_toy_backend()
  return Tokenizer(backend, config, toy_vocab.TOY_CHAT_TEMPLATE, generation_config)
