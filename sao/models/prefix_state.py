"""Per-row model state after a token prefix, moved between the batched KV cache and host memory (the local
engine's prefix cache keeps these between the turns of a conversation).

A `RowState` is what the model needs to continue one row after its first `length` tokens:
  full-attention layers: {'k', 'v': [length, K, D]} (the keys/values of those tokens, in order);
  linear-attention layers: {'conv': [Kc − 1, C], 'state': [Hv, Dk, Dv]} (the conv inputs and the gated delta rule's
  state after exactly those tokens).
A state without linear-attention layers can be cut to any shorter prefix (`truncated`): keys/values of token t depend
only on tokens <= t. A recurrent state cannot: it is reusable only for its exact prefix.

Batched layout (`pack`): the cache of `sao.models.transformer.init_cache` with S = Lb + Pb + N slots. Row b's prefix
of L_b tokens sits left-padded in slots [Lb − L_b, Lb) (mask true), `index` = Lb for every row, so the prompt suffix
is prefilled at [Lb, Lb + Pb) and decoding continues after it. Positions come from the count of real slots, so the
padding between prefix and suffix changes nothing. A row without a prefix has L_b = 0 (all prefix slots masked,
zero recurrent state): it computes what a fresh cache computes.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from sao.models.config import ModelConfig
from sao.models.gated_deltanet import linear_attention_cache


@dataclasses.dataclass(frozen=True)
class RowState:
  """The model state of one row after its first `length` tokens (module docstring); arrays are host numpy."""
  length: int
  layers: dict[str, dict[str, np.ndarray]]

  @property
  def nbytes(self) -> int:
    return sum(a.nbytes for entry in self.layers.values() for a in entry.values())

  @property
  def truncatable(self) -> bool:
    """True when every layer is full attention (then any shorter prefix's state is a slice of this one)."""
    return all("k" in entry for entry in self.layers.values())

  def truncated(self, length: int) -> "RowState":
    """The state after the first `length` tokens (0 < length <= self.length); only full-attention states."""
    if length == self.length:
      return self
    if not 0 < length < self.length:
      raise ValueError(f"truncated: length {length} outside (0, {self.length}]")
    if not self.truncatable:
      raise ValueError("truncated: a linear-attention (recurrent) state holds only its exact prefix")
    return RowState(length, {name: {key: a[:length] for key, a in entry.items()}
                             for name, entry in self.layers.items()})


def pack(config: ModelConfig, prefixes: Sequence[RowState | None], batch: int, prefix_slots: int,
         total_slots: int) -> dict[str, Any]:
  """A numpy cache (init_cache's tree) for `batch` rows of `total_slots` slots, rows' prefixes placed as in the
  module docstring (prefix_slots = Lb >= every prefix length). Rows past len(prefixes) and None rows start empty."""
  dtype = jnp.dtype(config.dtype)
  mask = np.zeros((batch, total_slots), bool)
  layers: dict[str, dict[str, np.ndarray]] = {}
  for i, kind in enumerate(config.layer_types):
    if kind == "linear_attention":
      layers[f"layers_{i}"] = {k: np.zeros(v.shape, v.dtype)
                               for k, v in linear_attention_cache(config, batch, dtype).items()}
    else:
      shape = (batch, total_slots, config.num_kv_heads, config.head_dim)
      layers[f"layers_{i}"] = {"k": np.zeros(shape, dtype), "v": np.zeros(shape, dtype)}
  for b, prefix in enumerate(prefixes):
    if prefix is None or prefix.length == 0:
      continue
    if prefix.length > prefix_slots:
      raise ValueError(f"prefixes[{b}]: {prefix.length} tokens exceed the {prefix_slots} prefix slots")
    if set(prefix.layers) != set(layers):
      raise ValueError(f"prefixes[{b}]: layers {sorted(prefix.layers)} are not the model's {sorted(layers)}")
    start = prefix_slots - prefix.length
    mask[b, start:prefix_slots] = True
    for name, entry in prefix.layers.items():
      if "k" in entry:
        layers[name]["k"][b, start:prefix_slots] = entry["k"]
        layers[name]["v"][b, start:prefix_slots] = entry["v"]
      else:
        layers[name]["conv"][b] = entry["conv"]
        layers[name]["state"][b] = entry["state"]
  return {"index": np.full((batch,), prefix_slots, np.int32), "mask": mask, "layers": layers}


def unpack(cache: dict[str, Any], lengths: Sequence[int]) -> list[RowState]:
  """The state of each of the first len(lengths) rows of a (host) cache: its real slots, in order. `lengths[b]` is
  the number of real tokens row b fed (a check: the cache's mask must agree)."""
  mask = np.asarray(cache["mask"])
  states = []
  for b, length in enumerate(lengths):
    slots = np.flatnonzero(mask[b])
    if slots.size != length:
      raise ValueError(f"row {b}: the cache holds {slots.size} real tokens, expected {length}")
    layers = {}
    for name, entry in cache["layers"].items():
      if "k" in entry:
        layers[name] = {"k": np.asarray(entry["k"][b, slots]), "v": np.asarray(entry["v"][b, slots])}
      else:
        layers[name] = {"conv": np.array(entry["conv"][b]), "state": np.array(entry["state"][b])}
    states.append(RowState(int(length), layers))
  return states
