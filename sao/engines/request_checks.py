"""Validation of one `/generate` row (prompt ids + SGLang `sampling_params`) before it may join a batch.

Every field is type- and range-checked here, per request, so that no value a client sends can fail inside the
batched sampler (where a failure would take the row's batch-mates with it): ids and stop ids lie in the vocabulary
(so they fit int32), `top_k` is clamped to the vocabulary, `max_new_tokens` to the context, and floats are finite
and in range. A violation raises `RequestError` naming the field (the HTTP app answers 400 with its message).
Numbers must be JSON numbers of the right kind: `max_new_tokens: 8.0`, `true` for an integer, or a string are
refused rather than coerced.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

from sao.models.sampling import SamplingParams

# The sampling_params keys the local engine understands (SGLang's names); any other key is refused.
KNOWN_SAMPLING_KEYS = frozenset({"max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids", "ignore_eos",
                                 "skip_special_tokens", "stop", "min_p", "n", "no_stop_trim"})
# Below this a positive temperature makes logits / τ overflow float32 (log-probs turn NaN): 0 means greedy.
MIN_TEMPERATURE = 1e-5
# float32 must represent τ (and 1/τ stays finite above MIN_TEMPERATURE).
MAX_TEMPERATURE = 1e6
_F32_TINY = float(np.finfo(np.float32).tiny)  # 1.1755e-38
# Integer fields become int32 in the sampler: larger values are refused, not wrapped (in-range ones are clamped).
MAX_INT32 = 2**31 - 1


class RequestError(ValueError):
  """A malformed request (answered with HTTP 400 and this message, which names the offending field)."""


@dataclasses.dataclass(frozen=True)
class RowLimits:
  """What a row must fit: ids in [0, vocab_size); prompt + completion ≤ context_length; completions ≤
  max_new_tokens_cap (the largest new-token bucket); at most max_stop_ids stop ids, eos ids included."""
  vocab_size: int
  context_length: int
  max_new_tokens_cap: int
  max_stop_ids: int
  eos_ids: tuple[int, ...] = ()


def _is_int(x: Any) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool)


def _int_field(params: Mapping[str, Any], name: str, default: int) -> int:
  value = params.get(name, default)
  if not _is_int(value):
    raise RequestError(f"sampling_params.{name}: expected an integer, got {value!r}")
  if abs(value) > MAX_INT32:
    raise RequestError(f"sampling_params.{name}: {value} is out of range (|value| <= {MAX_INT32})")
  return value


def _float_field(params: Mapping[str, Any], name: str, default: float) -> float:
  value = params.get(name, default)
  if not _is_number(value):
    raise RequestError(f"sampling_params.{name}: expected a number, got {value!r}")
  try:
    value = float(value)
  except OverflowError as e:  # an integer beyond float range
    raise RequestError(f"sampling_params.{name}: {value} is out of range") from e
  if not math.isfinite(value):
    raise RequestError(f"sampling_params.{name}: must be a finite number, got {value}")
  return value


def _bool_field(params: Mapping[str, Any], name: str) -> bool:
  value = params.get(name, False)
  if not isinstance(value, bool):
    raise RequestError(f"sampling_params.{name}: expected true or false, got {value!r}")
  return value


def token_ids(where: str, ids: Any, vocab_size: int) -> np.ndarray:
  """A non-empty list of ids in [0, vocab_size) → [n] int32; raises `RequestError` naming `where` and the id."""
  if not isinstance(ids, list) or not ids:
    raise RequestError(f"{where}: expected a non-empty list of token ids")
  for pos, t in enumerate(ids):  # checked as Python ints: 2**70 must not reach numpy (it overflows int64)
    if not _is_int(t):
      raise RequestError(f"{where}: token id {t!r} at position {pos} is not an integer")
    if not 0 <= t < vocab_size:
      raise RequestError(f"{where}: token id {t} at position {pos} is out of range [0, {vocab_size})")
  return np.asarray(ids, np.int32)


def check_row(where: str, input_ids: Any, params: Any, limits: RowLimits) -> tuple[np.ndarray, SamplingParams]:
  """Validates one prompt + sampling_params dict. Returns (prompt [P] int32, SamplingParams) ready to batch.

  `where` names the prompt in messages (`input_ids` or `input_ids[3]`). `max_new_tokens` is clamped so prompt +
  completion fits the context (the completion then ends with finish reason `length`); `top_k` 0 or -1 turns
  truncation off and values above the vocabulary keep the whole vocabulary. Integers beyond int32 are refused.
  """
  prompt = token_ids(where, input_ids, limits.vocab_size)
  if prompt.size >= limits.context_length:
    raise RequestError(f"{where}: prompt of {prompt.size} tokens does not fit the context length "
                       f"{limits.context_length}")
  if not isinstance(params, Mapping):
    raise RequestError(f"sampling_params: expected an object, got {type(params).__name__}")
  unknown = sorted(str(k) for k in set(params) - KNOWN_SAMPLING_KEYS)
  if unknown:
    raise RequestError(f"sampling_params: unsupported keys {unknown}")
  if params.get("stop"):
    raise RequestError("sampling_params.stop: stop strings are not supported by the local engine; "
                       "use stop_token_ids")
  if _int_field(params, "n", 1) != 1:
    raise RequestError("sampling_params.n: only n = 1 is supported")
  if _float_field(params, "min_p", 0.0) != 0.0:
    raise RequestError("sampling_params.min_p: not supported by the local engine (only 0)")
  max_new = _int_field(params, "max_new_tokens", 128)
  if max_new < 1:
    raise RequestError(f"sampling_params.max_new_tokens: must be >= 1, got {max_new}")
  temperature = _float_field(params, "temperature", 1.0)
  if temperature != 0 and not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:
    raise RequestError(f"sampling_params.temperature: must be 0 (greedy) or in [{MIN_TEMPERATURE}, "
                       f"{MAX_TEMPERATURE:g}], got {temperature}")
  top_p = _float_field(params, "top_p", 1.0)
  # Checked in float32, the dtype the sampler uses: 1e-40 is > 0 as a Python float but 0 (or a subnormal that
  # accelerators flush to 0) in float32, and top_p 0 keeps no token.
  if not (_F32_TINY <= np.float32(top_p) <= 1 and top_p > 0):
    raise RequestError(f"sampling_params.top_p: must be in (0, 1] and at least {_F32_TINY:.4g} (float32's "
                       f"smallest normal number, the sampler's dtype), got {top_p}")
  top_k = _int_field(params, "top_k", -1)
  if top_k < -1:
    raise RequestError(f"sampling_params.top_k: must be -1 (off), 0 (off) or a positive integer, got {top_k}")
  stop_ids = params.get("stop_token_ids")
  if stop_ids is None:
    stop_ids = []
  if not isinstance(stop_ids, list):
    raise RequestError(f"sampling_params.stop_token_ids: expected a list of token ids, got {stop_ids!r}")
  stop = token_ids("sampling_params.stop_token_ids", stop_ids, limits.vocab_size).tolist() if stop_ids else []
  for name in ("ignore_eos", "skip_special_tokens", "no_stop_trim"):
    if name in params:
      _bool_field(params, name)
  if not params.get("ignore_eos", False):
    stop += [t for t in limits.eos_ids if t not in stop]
  if len(stop) > limits.max_stop_ids:
    raise RequestError(f"sampling_params.stop_token_ids: at most {limits.max_stop_ids} ids (eos included), "
                       f"got {len(stop)}")
  max_new = min(max_new, limits.context_length - prompt.size, limits.max_new_tokens_cap)
  return prompt, SamplingParams(max_new_tokens=max_new, temperature=temperature, top_p=top_p,
                                top_k=min(max(top_k, 0), limits.vocab_size), stop_token_ids=tuple(stop))


def check_generate_body(body: Any, limits: RowLimits) -> tuple[bool, list[tuple[np.ndarray, SamplingParams]],
                                                               list[Mapping[str, Any]]]:
  """A whole `/generate` body → (batched, checked rows, raw sampling_params per row). SGLang's two forms: one
  prompt (`input_ids: [int]`, one params object) or a batch (`input_ids: [[int]]`, one object or a list of one per
  prompt)."""
  if not isinstance(body, Mapping):
    raise RequestError("request body must be a JSON object")
  if "input_ids" not in body:
    raise RequestError("input_ids: required (the local engine takes token ids, not text)")
  if body.get("stream", False) is not False:
    raise RequestError("stream: streaming is not supported by the local engine")
  input_ids = body["input_ids"]
  batched = isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)
  prompts: Sequence[Any] = input_ids if batched else [input_ids]
  # Log-probs are always returned; a malformed flag is still refused, as SGLang refuses it (true/false, or a list
  # of them, one per prompt).
  flag = body.get("return_logprob")
  flags = flag if isinstance(flag, list) else [flag]
  if flag is not None and (not all(isinstance(f, bool) for f in flags)
                           or isinstance(flag, list) and len(flag) != len(prompts)):
    raise RequestError(f"return_logprob: expected true or false (or a list of them, one per prompt), got {flag!r}")
  sp = body.get("sampling_params")
  if sp is None:
    sp = {}
  if isinstance(sp, list):
    if not batched or len(sp) != len(prompts):
      raise RequestError(f"sampling_params: a list needs one entry per prompt ({len(prompts)})")
    sps = sp
  else:
    sps = [sp] * len(prompts)
  rows = [check_row(f"input_ids[{i}]" if batched else "input_ids", p, s, limits)
          for i, (p, s) in enumerate(zip(prompts, sps))]
  return batched, rows, sps


def routed_experts_flags(body: Mapping[str, Any], num_rows: int) -> list[bool]:
  """`return_routed_experts` per row (SGLang's request field: one bool for every row, or a list of one per row;
  absent: False). RequestError naming the field for anything else."""
  value = body.get("return_routed_experts", False)
  values = value if isinstance(value, list) else [value] * num_rows
  if len(values) != num_rows or not all(isinstance(v, bool) for v in values):
    raise RequestError(f"return_routed_experts: expected a boolean or a list of {num_rows} booleans, got {value!r}")
  return values
