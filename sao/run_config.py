"""The run's experiment config (one `ml_collections.ConfigDict`, `experiments/configs/`), read the same way everywhere.

- dotted keys: `resolve(config, "learner.sao.critic_epochs")` -> (the node holding it, "critic_epochs"), and
  `set_dotted`; an unknown key is a `KeyError` naming the whole dotted key;
- typed overrides from text (`apply_overrides(config, {"total_steps": "50"})`): each value takes the type of the value
  it replaces, and booleans parse strictly (`true`/`false`/`1`/`0`/`yes`/`no`; `ture` is an error, not False), as
  ml_collections' `--config.<key>=<value>` flags do;
- facts several processes derive from the config (trainer and rollout workers must agree): `tokenizer_path`.

It imports nothing from `sao`: the trainer (`sao.train`), the rollout worker (`sao.rollout`) and the entry points
(`experiments`, `launch`) all use it.
"""
from __future__ import annotations

from typing import Any, Mapping

import ml_collections

_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


def resolve(config: ml_collections.ConfigDict, dotted: str) -> tuple[Any, str]:
  """(the node holding `dotted`'s last part, that part). KeyError(dotted) if any part is missing."""
  node = config
  *path, leaf = dotted.split(".")
  for key in path:
    if key not in node or not isinstance(node[key], (ml_collections.ConfigDict, dict)):
      raise KeyError(dotted)
    node = node[key]
  if leaf not in node:
    raise KeyError(dotted)
  return node, leaf


def get_dotted(config: ml_collections.ConfigDict, dotted: str) -> Any:
  node, leaf = resolve(config, dotted)
  return node[leaf]


def set_dotted(config: ml_collections.ConfigDict, dotted: str, value: Any) -> None:
  """`config.<dotted> = value` for an existing key; KeyError naming `dotted` if the config has no such key."""
  node, leaf = resolve(config, dotted)
  node[leaf] = value


def set_all(config: ml_collections.ConfigDict, values: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """`set_dotted` for each item; returns `config`."""
  for dotted, value in values.items():
    set_dotted(config, dotted, value)
  return config


def parse_bool(text: str, what: str = "value") -> bool:
  """`true`/`false`, `1`/`0`, `yes`/`no` (any case); anything else is a ValueError naming `what`."""
  lowered = text.strip().lower()
  if lowered in _TRUE:
    return True
  if lowered in _FALSE:
    return False
  raise ValueError(f"{what}: {text!r} is not a boolean (true/false, 1/0, yes/no)")


def parse_like(current: Any, text: str, what: str = "value") -> Any:
  """`text` converted to the type of `current` (the value it replaces). Tuples take `+`-separated items
  (`http://a:1+http://b:2`, `8+9+10`), typed like the current items (strings when the current tuple is empty)."""
  if isinstance(current, (tuple, list)):
    items = [v for v in text.split("+") if v]
    kind = type(current[0]) if current and isinstance(current[0], (bool, int, float)) else str
    try:
      return tuple(parse_like(kind(), v, what) if kind is bool else kind(v) for v in items)
    except ValueError as e:
      raise ValueError(f"{what}={text!r}: items must be {kind.__name__}s") from e
  try:
    if isinstance(current, bool):
      return parse_bool(text, what)
    if isinstance(current, int):
      return int(text)
    if isinstance(current, float):
      return float(text)
  except ValueError as e:
    raise ValueError(f"{what}={text!r}: expected {type(current).__name__} ({e})") from None
  return text


def apply_overrides(config: ml_collections.ConfigDict, overrides: Mapping[str, str]) -> None:
  """Sets dotted keys from text (`parse_like`); an unknown key or an unparsable value is a ValueError naming it."""
  for dotted, text in overrides.items():
    try:
      node, leaf = resolve(config, dotted)
    except KeyError:
      raise ValueError(f"config arg: unknown key {dotted!r}") from None
    node[leaf] = parse_like(node[leaf], text, f"config arg: {dotted}")


def format_value(value: Any) -> str:
  """`value` as a `--config.<key>=<value>` flag value that ml_collections parses back to the same value (tuples as
  Python literals; `True`/`False` parse strictly)."""
  if isinstance(value, (tuple, list)):
    return repr(tuple(value))
  return str(value)


def override_flags(overrides: Mapping[str, Any]) -> list[str]:
  """`{"total_steps": 50}` -> `["--config.total_steps=50"]` (sorted by key)."""
  return [f"--config.{key}={format_value(value)}" for key, value in sorted(overrides.items())]


def tokenizer_path(config: ml_collections.ConfigDict) -> str:
  """The tokenizer every process of the run uses: `model.tokenizer_path`, else the HF checkpoint's own
  (`model.hf_path` when `model.init == "hf"`), else "" (the built-in toy tokenizer)."""
  model = config.model
  if model.tokenizer_path:
    return model.tokenizer_path
  return model.hf_path if model.init == "hf" else ""
