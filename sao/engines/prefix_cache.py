"""A prefix cache across the turns of a conversation (the local engine's answer to SGLang's RadixAttention).

An entry is the model state (`sao.models.prefix_state.RowState`) after a token sequence, normally a request's
prompt + its completion. A later request whose prompt starts with an entry's tokens reuses that state and prefills
only the rest of its prompt. When a hit happens (`lookup`), for a prompt of P tokens:
  * full-attention models (the state can be cut, `RowState.truncatable`): the entry sharing the longest common
    prefix c >= `block_size` tokens with the prompt; it reuses min(c, P − 1) tokens (a request that diverges from a
    cached conversation mid-way still reuses what they share);
  * hybrid models (a recurrent linear-attention state holds only its exact prefix): the longest entry whose whole
    token sequence (of L >= `block_size` tokens) is a prefix of the prompt with L <= P − 1.
At least the prompt's last token is always prefilled (its logits start the decode).

Index: the chained hash of every prefix of whole blocks of `block_size` tokens, h_j = hash((h_{j−1}, block j)); an
entry of L tokens is registered under its last full block (j = L // block_size) and, for truncatable states, under
every earlier one. A lookup walks the prompt's block hashes from the longest down; at the first key with a usable
entry among its most recent `_CANDIDATES`, it takes the one with the longest usable prefix (tokens are always
verified: a hash collision is a miss).

Bounds and invalidation: the entries' bytes (states + token ids) stay <= `max_bytes`, least recently used evicted
first; an entry larger than the bound is not stored. The cache belongs to one weight version: `clear(version)` on a
weight update drops everything, and `lookup` / `insert` with any other version miss / are ignored, so a new policy
version never reuses the keys/values of an old one. An insert that extends the entry its request reused replaces
that entry (the same conversation one turn later). Thread-safe.
"""
from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any, Callable

import numpy as np

__all__ = ["PrefixCache", "PrefixHit"]

# Entries verified per index key and lookup: beyond a shared block, the most recent few (a system prompt shared by
# every conversation must not make a lookup scan them all).
_CANDIDATES = 8


@dataclasses.dataclass(frozen=True)
class PrefixHit:
  """state: the cached state (not yet cut to `length`); length: prompt tokens to reuse; entry_id: its entry."""
  state: Any
  length: int
  entry_id: int


@dataclasses.dataclass
class _Entry:
  tokens: np.ndarray  # [L] int32
  state: Any  # .length == L, .nbytes
  nbytes: int
  keys: tuple[int, ...]  # the index hashes it is registered under


def block_hashes(tokens: np.ndarray, block_size: int) -> list[int]:
  """h[j − 1] = the chained hash of tokens[:j · block_size], for j = 1 … len(tokens) // block_size (one Python hash
  per block of ids, not per token: a lookup costs microseconds per row)."""
  ids = np.asarray(tokens, np.int64)
  out, h = [], 0
  for j in range(ids.size // block_size):
    h = hash((h, ids[j * block_size:(j + 1) * block_size].tobytes()))
    out.append(h)
  return out


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
  n = min(a.size, b.size)
  diff = np.flatnonzero(a[:n] != b[:n])
  return int(diff[0]) if diff.size else n


class PrefixCache:
  """Token-prefix → model state, LRU within `max_bytes`, for one weight version at a time (module docstring)."""

  def __init__(self, max_bytes: int, truncatable: bool, version: str = "0", block_size: int = 16):
    if max_bytes <= 0:
      raise ValueError(f"max_bytes: must be > 0, got {max_bytes}")
    if block_size < 1:
      raise ValueError(f"block_size: must be >= 1, got {block_size}")
    self.max_bytes = int(max_bytes)
    self.truncatable = truncatable
    self.block_size = block_size
    self.version = str(version)
    self._entries: collections.OrderedDict[int, _Entry] = collections.OrderedDict()  # LRU first
    self._index: dict[int, dict[int, None]] = {}  # hash → entry ids (insertion-ordered set)
    self._next_id = 0
    self._lock = threading.Lock()
    self.nbytes = 0
    self.stats = {"lookups": 0, "hits": 0, "reused_tokens": 0, "inserts": 0, "evictions": 0, "clears": 0}

  def __len__(self) -> int:
    return len(self._entries)

  def clear(self, version: str) -> None:
    """Drops every entry; from now on only `version` is served (call it when the weights change)."""
    with self._lock:
      self._entries.clear()
      self._index.clear()
      self.nbytes = 0
      self.version = str(version)
      self.stats["clears"] += 1

  def lookup(self, tokens: np.ndarray, version: str, accept: Callable[[Any], bool] | None = None) -> PrefixHit | None:
    """The cached state to continue `tokens` [P] from, or None (module docstring: when a hit happens). `accept`:
    only entries whose state it accepts are candidates (the engine's routed-experts rows need recorded routing)."""
    tokens = np.asarray(tokens, np.int64).reshape(-1)
    with self._lock:
      self.stats["lookups"] += 1
      if str(version) != self.version or not self._entries or tokens.size <= self.block_size:
        return None
      usable_tokens = tokens[:-1]  # the last prompt token is always prefilled
      hashes = block_hashes(usable_tokens, self.block_size)
      for j in range(len(hashes), 0, -1):
        candidates = list(self._index.get(hashes[j - 1], {}))[-_CANDIDATES:]  # the most recent
        best, best_id = 0, None
        for entry_id in candidates:
          entry = self._entries[entry_id]
          if accept is not None and not accept(entry.state):
            continue
          common = _common_prefix(entry.tokens, usable_tokens)
          if self.truncatable:
            usable = common
          else:  # only the entry's exact state: all of its tokens must be the prompt's first ones
            usable = entry.tokens.size if common == entry.tokens.size else 0
          if usable > best:
            best, best_id = usable, entry_id
        if best >= self.block_size:
          self._entries.move_to_end(best_id)
          self.stats["hits"] += 1
          self.stats["reused_tokens"] += best
          return PrefixHit(self._entries[best_id].state, best, best_id)
      return None

  def insert(self, tokens: np.ndarray, state: Any, version: str, replaces: int | None = None) -> bool:
    """Stores `state` (the state after all of `tokens` [L]); returns whether it was stored. `replaces`: the entry
    the request reused, dropped when `tokens` extends it. Ignored for another version, for fewer than `block_size`
    tokens, or for a state larger than the whole bound."""
    tokens = np.asarray(tokens, np.int32).reshape(-1)
    if state.length != tokens.size:
      raise ValueError(f"insert: the state covers {state.length} tokens, the key has {tokens.size}")
    nbytes = int(state.nbytes) + tokens.nbytes
    with self._lock:
      if str(version) != self.version or tokens.size < self.block_size or nbytes > self.max_bytes:
        return False
      hashes = block_hashes(tokens, self.block_size)
      # Registered under its last full block (its anchor); a cuttable state also under every earlier block.
      keys = tuple(hashes) if self.truncatable else (hashes[-1],)
      for entry_id in list(self._index.get(hashes[-1], {})):  # the same sequence again: keep the newest only
        if np.array_equal(self._entries[entry_id].tokens, tokens):
          self._remove(entry_id)
      if replaces is not None and replaces in self._entries:
        old = self._entries[replaces].tokens
        if old.size < tokens.size and np.array_equal(old, tokens[:old.size]):
          self._remove(replaces)
      entry_id = self._next_id
      self._next_id += 1
      self._entries[entry_id] = _Entry(tokens, state, nbytes, keys)
      for key in keys:
        self._index.setdefault(key, {})[entry_id] = None
      self.nbytes += nbytes
      self.stats["inserts"] += 1
      while self.nbytes > self.max_bytes:
        self._remove(next(iter(self._entries)))
        self.stats["evictions"] += 1
      return True

  def _remove(self, entry_id: int) -> None:
    entry = self._entries.pop(entry_id)
    self.nbytes -= entry.nbytes
    for key in entry.keys:
      ids = self._index.get(key)
      if ids is not None:
        ids.pop(entry_id, None)
        if not ids:
          del self._index[key]
