"""A prefix-cache entry that keeps its tokens' routed experts beside the model state (MoE routing replay).

SGLang returns the routing of a cached prefix from the record it kept when those tokens were computed; so does the
local engine: its prefix cache (`sao.engines.prefix_cache`) stores `RoutedState`s, the model state after L tokens
and, when the batch that computed them captured routing, those L tokens' routed experts `[L, layers, top_k]`. A
request asking for routed experts may then continue from a cached conversation (the next agent turn) and still get
every token's record; an entry without one (computed by a batch that captured nothing) is not reused for it.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class RoutedState:
  """state: the model state (`RowState`) after `length` tokens; routing: their routed experts [length, L, k] int32,
  or None when not recorded. Has what the prefix cache reads of a state (`length`, `nbytes`, `truncated`)."""
  state: Any
  routing: np.ndarray | None = None

  def __post_init__(self):
    if self.routing is not None and len(self.routing) != self.state.length:
      raise ValueError(f"routing: {len(self.routing)} rows for a state of {self.state.length} tokens")

  @property
  def length(self) -> int:
    return self.state.length

  @property
  def nbytes(self) -> int:
    return int(self.state.nbytes) + (0 if self.routing is None else self.routing.nbytes)

  def truncated(self, length: int) -> RoutedState:
    """The state and routing of the first `length` tokens."""
    return RoutedState(self.state.truncated(length), None if self.routing is None else self.routing[:length])


def has_routing(state: RoutedState) -> bool:
  """Whether a cached entry recorded its tokens' routing: the prefix cache's `accept` for a row that asks for routed
  experts (an entry without a record is not reused for it)."""
  return state.routing is not None
