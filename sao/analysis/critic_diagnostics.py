"""Per-token critic value inspection (docs/algorithm.md, "The write-up's reported numbers"), pure numpy.

Inputs are one trace's per-token critic values `values: [T] float`, its `action_mask: [T] bool` (1 on model-action
tokens) and `turn_boundaries` (token offsets where each message starts, as in the trajectory record). Only action
tokens are inspected: tool observations are context, never plotted tokens, so consecutive action tokens are compared
across the observations between them. With `a_0 < a_1 < ... < a_{n-1}` the action positions:

    ΔV = V[a_{n-1}] − V[a_0];   first/second-half means over a_0..a_{⌊n/2⌋−1} and a_{⌊n/2⌋}..a_{n-1}
    transition k: (a_k, a_{k+1}), k < n − 1;  a boundary transition if a message starts in (a_k, a_{k+1}]
    jump: |V[a_{k+1}] − V[a_k]| > threshold (0.1)

so a trace has `n − 1` transitions, each either at a boundary or within a turn (the write-up: 3,450 + 955,928 =
959,418 − 40 over 40 traces). Its finding: 1.86 % of boundary vs 0.20 % of within-turn transitions jump (≈ 9.2×).
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

import numpy as np

JUMP_THRESHOLD = 0.1


@dataclasses.dataclass(frozen=True)
class TraceSummary:
  """Values along one trace's action tokens."""
  num_action_tokens: int
  first_value: float
  last_value: float
  delta_v: float  # last − first
  mean_value: float
  first_half_mean: float
  second_half_mean: float


@dataclasses.dataclass(frozen=True)
class JumpStats:
  """Large value changes at message boundaries vs within turns (counts over one or many traces)."""
  boundary_transitions: int
  boundary_jumps: int
  within_transitions: int
  within_jumps: int

  @property
  def boundary_rate(self) -> float:
    return self.boundary_jumps / self.boundary_transitions if self.boundary_transitions else float("nan")

  @property
  def within_rate(self) -> float:
    return self.within_jumps / self.within_transitions if self.within_transitions else float("nan")

  @property
  def ratio(self) -> float:
    """How many times as often a boundary transition jumps as a within-turn one (NaN when undefined)."""
    if not self.within_rate or np.isnan(self.within_rate) or np.isnan(self.boundary_rate):
      return float("nan")
    return self.boundary_rate / self.within_rate

  def __add__(self, other: "JumpStats") -> "JumpStats":
    return JumpStats(self.boundary_transitions + other.boundary_transitions,
                     self.boundary_jumps + other.boundary_jumps,
                     self.within_transitions + other.within_transitions, self.within_jumps + other.within_jumps)


def _action_values(values: np.ndarray, action_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  values = np.asarray(values, np.float64)
  action_mask = np.asarray(action_mask, bool)
  if values.ndim != 1 or values.shape != action_mask.shape:
    raise ValueError(f"values {values.shape} and action_mask {action_mask.shape} must be equal-length 1-D arrays")
  positions = np.flatnonzero(action_mask)
  if positions.size == 0:
    raise ValueError("trace has no action tokens (action_mask is all 0)")
  if not np.all(np.isfinite(values[positions])):
    raise ValueError("values: non-finite value on an action token")
  return positions, values[positions]


def trace_summary(values: np.ndarray, action_mask: np.ndarray) -> TraceSummary:
  """ΔV, endpoint values and half means over the action tokens of one trace (`values`, `action_mask`: [T])."""
  _, v = _action_values(values, action_mask)
  half = v.size // 2
  first = v[:half] if half else v  # one action token: both halves are that token
  return TraceSummary(num_action_tokens=int(v.size), first_value=float(v[0]), last_value=float(v[-1]),
                      delta_v=float(v[-1] - v[0]), mean_value=float(v.mean()), first_half_mean=float(first.mean()),
                      second_half_mean=float(v[half:].mean()))


def message_index(num_tokens: int, turn_boundaries: Sequence[int]) -> np.ndarray:
  """`[T]` int: which message each token belongs to (−1 before the first boundary)."""
  b = np.asarray(turn_boundaries, np.int64)
  if b.size and (np.any(np.diff(b) <= 0) or b[0] < 0 or b[-1] >= num_tokens):
    raise ValueError(f"turn_boundaries must be strictly increasing offsets in [0, {num_tokens}), got {list(b)}")
  return np.searchsorted(b, np.arange(num_tokens), side="right") - 1


def transitions(values: np.ndarray, action_mask: np.ndarray, turn_boundaries: Sequence[int]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Consecutive action-token pairs: (ΔV [n−1], is_boundary [n−1] bool, position of the later token [n−1])."""
  positions, v = _action_values(values, action_mask)
  message = message_index(len(action_mask), turn_boundaries)[positions]
  return np.diff(v), message[1:] != message[:-1], positions[1:]


def value_jumps(values: np.ndarray, action_mask: np.ndarray, turn_boundaries: Sequence[int],
                threshold: float = JUMP_THRESHOLD) -> JumpStats:
  """Counts of |ΔV| > threshold at message boundaries vs within turns for one trace."""
  delta, boundary, _ = transitions(values, action_mask, turn_boundaries)
  jump = np.abs(delta) > threshold
  return JumpStats(boundary_transitions=int(boundary.sum()), boundary_jumps=int((jump & boundary).sum()),
                   within_transitions=int((~boundary).sum()), within_jumps=int((jump & ~boundary).sum()))


def total_jumps(stats: Iterable[JumpStats]) -> JumpStats:
  total = JumpStats(0, 0, 0, 0)
  for s in stats:
    total = total + s
  return total


def largest_boundary_jumps(values: np.ndarray, action_mask: np.ndarray, turn_boundaries: Sequence[int],
                           k: int = 1) -> list[tuple[int, float]]:
  """The `k` boundary transitions with the largest |ΔV| as (token position after the boundary, signed ΔV)."""
  delta, boundary, position = transitions(values, action_mask, turn_boundaries)
  idx = np.flatnonzero(boundary)
  idx = idx[np.argsort(-np.abs(delta[idx]), kind="stable")][:k]
  return [(int(position[i]), float(delta[i])) for i in idx]


def per_turn_means(values: np.ndarray, action_mask: np.ndarray, turn_boundaries: Sequence[int]
                   ) -> list[tuple[int, float]]:
  """(message index, mean value over its action tokens) for each message that has action tokens (the thick
  per-turn lines of the write-up's Figure 7)."""
  positions, v = _action_values(values, action_mask)
  message = message_index(len(action_mask), turn_boundaries)[positions]
  return [(int(m), float(v[message == m].mean())) for m in np.unique(message)]


def success_beats_failure(pairs: Sequence[tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]]
                          ) -> tuple[int, int]:
  """Over (success (values, mask), paired failure (values, mask)) pairs — one per step in the write-up — how many
  have a higher success mean value: (wins, pairs). The write-up: 19 of 20."""
  wins = sum(trace_summary(*success).mean_value > trace_summary(*failure).mean_value for success, failure in pairs)
  return int(wins), len(pairs)


def summarize_markdown(stats: JumpStats, summaries: Sequence[TraceSummary] = (),
                       threshold: float = JUMP_THRESHOLD) -> str:
  """A small markdown report: jump rates at boundaries vs within turns, and per-trace ΔV."""
  lines = [f"| transitions | count | \\|ΔV\\| > {threshold} | rate |", "|---|---:|---:|---:|",
           f"| message boundary | {stats.boundary_transitions} | {stats.boundary_jumps} | "
           f"{100 * stats.boundary_rate:.2f} % |",
           f"| within turn | {stats.within_transitions} | {stats.within_jumps} | {100 * stats.within_rate:.2f} % |",
           "", f"boundary / within-turn jump rate: {stats.ratio:.1f}×"]
  if summaries:
    lines += ["", "| trace | V first | V last | ΔV | first-half mean | second-half mean |",
              "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {i} | {s.first_value:.3f} | {s.last_value:.3f} | {s.delta_v:+.3f} | {s.first_half_mean:.3f} | "
              f"{s.second_half_mean:.3f} |" for i, s in enumerate(summaries)]
  return "\n".join(lines)
