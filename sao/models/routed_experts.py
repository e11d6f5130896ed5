"""MoE routing records in SGLang's `routed_experts` layout: capture from a forward pass, the wire codec, checks.

Layout (SGLang's `--enable-return-routed-experts`, as slime's routing replay consumes it): for a sequence of S
tokens (prompt + completion), an int32 array `[S − 1, L, k]` -- row t holds, for each of the L decoder layers, the
k expert ids the router chose when token t was fed (the last token is never fed to produce a next one, so it has no
row). Layers without experts (a dense layer of a mixed model) hold −1, as SGLang's capture buffer does for slots it
never filled. On the wire (`meta_info["routed_experts"]`) the array is the base64 text of its C-order little-endian
int32 bytes; the reader reshapes it with the model's L and k (S − 1 follows from the length).

Replay (`sao.models.moe.replay_route`) reads the same layout padded to `[B, T, L, k]`, −1 where nothing is replayed.
"""
from __future__ import annotations

import base64
import binascii
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sao.models.config import ModelConfig

Array = jax.Array
# The flax collection `sao.models.layers.MoE` sows the experts it used into (`experts`: [B, T, k] int32).
COLLECTION = "routing"
MISSING = -1  # no record for this (token, layer): a dense layer, padding, a token that was never fed
_WIRE_DTYPE = np.dtype("<i4")


def stack_captured(config: ModelConfig, captured: Any, batch_shape: tuple[int, int]) -> Array:
  """The `routing` collection of one forward (`model.apply(..., mutable=[COLLECTION])`'s second result) → the
  experts used, [B, T, L, k] int32 for batch_shape = (B, T); −1 on layers without experts."""
  layers = captured.get(COLLECTION, {}).get("model", {})
  k = config.num_experts_per_tok
  out = []
  for i in range(config.num_layers):
    if not config.is_moe_layer(i):
      out.append(jnp.full((*batch_shape, k), MISSING, jnp.int32))
      continue
    sown = layers.get(f"layers_{i}", {}).get("mlp", {}).get("routed_experts")
    if not sown:
      raise ValueError(f"routed experts: MoE layer {i} sowed no routing (was {COLLECTION!r} mutable?)")
    out.append(sown[-1].astype(jnp.int32))
  return jnp.stack(out, axis=2)


def encode(routed: np.ndarray) -> str:
  """[R, L, k] integer ids → SGLang's `meta_info["routed_experts"]` text (base64 of little-endian int32 bytes)."""
  arr = np.asarray(routed)
  if arr.ndim != 3 or arr.dtype.kind not in "iu":
    raise ValueError(f"routed_experts: expected an integer [tokens, layers, top_k] array, got {arr.dtype} "
                     f"{arr.shape}")
  return base64.b64encode(np.ascontiguousarray(arr, _WIRE_DTYPE).tobytes()).decode("ascii")


def decode(text: Any, num_layers: int, top_k: int) -> np.ndarray:
  """SGLang's `meta_info["routed_experts"]` text → int32 [R, num_layers, top_k]; ValueError naming what is wrong."""
  if not isinstance(text, str):
    raise ValueError(f"routed_experts: expected base64 text, got {type(text).__name__}")
  try:
    raw = base64.b64decode(text.encode("ascii"), validate=True)
  except (binascii.Error, UnicodeEncodeError) as e:
    raise ValueError(f"routed_experts: not base64 ({e})") from e
  row = _WIRE_DTYPE.itemsize * num_layers * top_k
  if num_layers < 1 or top_k < 1 or len(raw) % row:
    raise ValueError(f"routed_experts: {len(raw)} bytes do not split into rows of {num_layers} layers × {top_k} "
                     f"int32 ids")
  return np.frombuffer(raw, _WIRE_DTYPE).astype(np.int32).reshape(-1, num_layers, top_k)


def decode_rows(text: Any, num_rows: int) -> np.ndarray:
  """`meta_info["routed_experts"]` → int32 [num_rows, L·k] without knowing the model: each token's row of L·k ids
  (layer-major, SGLang's C order), to be reshaped to [num_rows, L, k] by whoever knows L and k (the learner)."""
  flat = decode(text, 1, 1).reshape(-1)
  if num_rows < 1 or flat.size % num_rows:
    raise ValueError(f"routed_experts: {flat.size} ids do not split into {num_rows} token rows")
  return flat.reshape(num_rows, -1)


def check(routed: np.ndarray, num_tokens: int, num_layers: int, top_k: int, num_experts: int,
          field: str = "routed_experts") -> None:
  """Raises ValueError naming `field` unless `routed` is int [R, num_layers, top_k] with R <= num_tokens, every id in
  [−1, num_experts), and each (token, layer) row either fully recorded (k distinct ids >= 0) or not at all (−1)."""
  arr = np.asarray(routed)
  if arr.ndim != 3 or arr.shape[1:] != (num_layers, top_k) or arr.dtype.kind not in "iu":
    raise ValueError(f"{field}: expected int [tokens, {num_layers}, {top_k}], got {arr.dtype} {arr.shape}")
  if arr.shape[0] > num_tokens:
    raise ValueError(f"{field}: {arr.shape[0]} rows for a sequence of {num_tokens} tokens")
  if arr.size == 0:
    return
  if arr.min() < MISSING or arr.max() >= num_experts:
    raise ValueError(f"{field}: ids in [{arr.min()}, {arr.max()}], outside [-1, {num_experts})")
  recorded = arr >= 0
  partial = recorded.any(-1) & ~recorded.all(-1)
  if partial.any():
    t, layer = np.argwhere(partial)[0]
    raise ValueError(f"{field}: token {t} layer {layer} mixes ids and -1: {arr[t, layer].tolist()}")
  ordered = np.sort(arr, axis=-1)
  repeated = recorded.all(-1) & (ordered[..., 1:] == ordered[..., :-1]).any(-1)
  if repeated.any():
    t, layer = np.argwhere(repeated)[0]
    raise ValueError(f"{field}: token {t} layer {layer} names an expert twice: {arr[t, layer].tolist()}")


def padded(routed: np.ndarray | None, num_tokens: int, num_layers: int, top_k: int) -> np.ndarray:
  """[R, L, k] (or None) → [num_tokens, L, k] int32, −1 in the rows past R (nothing replayed there)."""
  out = np.full((num_tokens, num_layers, top_k), MISSING, np.int32)
  if routed is not None:
    out[:len(routed)] = routed
  return out
