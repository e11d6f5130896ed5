"""Critic per-token diagnostics on constructed traces with known answers, and against a plain-loop reference."""
from __future__ import annotations

import numpy as np
import pytest

from sao.analysis import critic_diagnostics as cd


def _trace(num_turns=6, turn_len=5, obs_len=3, prompt_len=4):
  """Prompt, then `num_turns` × (assistant turn of `turn_len` action tokens, observation of `obs_len`).
  Returns (action_mask [T], turn_boundaries, [positions of each turn's action tokens])."""
  mask, boundaries, turns = [0] * prompt_len, [0], []
  for _ in range(num_turns):
    boundaries.append(len(mask))
    turns.append(list(range(len(mask), len(mask) + turn_len)))
    mask += [1] * turn_len
    boundaries.append(len(mask))
    mask += [0] * obs_len
  return np.asarray(mask, bool), boundaries, turns


def test_exactly_k_of_n_boundary_transitions_jump():
  mask, boundaries, turns = _trace()
  values = np.full(mask.shape, 7.0)  # observation tokens carry junk values that must be ignored
  level = 0.5
  jumping_boundaries = {1, 3, 4}  # into turns 1, 3, 4: k = 3 of n = 5 boundary transitions
  for t, positions in enumerate(turns):
    if t in jumping_boundaries:
      level += 0.2 if t != 3 else -0.3
    else:
      level += 0.05  # a small change at the other boundaries: not a jump
    values[positions] = level
  values[turns[2][3]] += 0.15  # one within-turn spike: 2 within-turn jumps (up, then down)
  stats = cd.value_jumps(values, mask, boundaries)
  assert (stats.boundary_transitions, stats.boundary_jumps) == (5, 3)
  assert (stats.within_transitions, stats.within_jumps) == (6 * 4, 2)
  assert stats.boundary_rate == pytest.approx(3 / 5) and stats.within_rate == pytest.approx(2 / 24)
  assert stats.ratio == pytest.approx((3 / 5) / (2 / 24))
  largest = cd.largest_boundary_jumps(values, mask, boundaries, k=2)
  assert largest[0] == (turns[3][0], pytest.approx(-0.3)) and largest[1][1] == pytest.approx(0.2)


def test_trace_summary_delta_and_halves():
  mask, boundaries, turns = _trace(num_turns=2, turn_len=3)
  values = np.zeros(mask.shape)
  action = [p for t in turns for p in t]
  values[action] = [0.895, 0.9, 0.92, 0.95, 0.99, 1.0]  # the write-up's success example endpoints
  s = cd.trace_summary(values, mask)
  assert s.num_action_tokens == 6 and s.first_value == 0.895 and s.last_value == 1.0
  assert s.delta_v == pytest.approx(0.105)
  assert s.first_half_mean == pytest.approx(np.mean([0.895, 0.9, 0.92]))
  assert s.second_half_mean == pytest.approx(np.mean([0.95, 0.99, 1.0]))
  assert cd.per_turn_means(values, mask, boundaries) == [(1, pytest.approx(np.mean([0.895, 0.9, 0.92]))),
                                                         (3, pytest.approx(np.mean([0.95, 0.99, 1.0])))]


def test_adjacent_assistant_messages_count_as_a_boundary():
  mask = np.array([0, 1, 1, 1, 1], bool)
  values = np.array([0.0, 0.1, 0.1, 0.5, 0.5])
  stats = cd.value_jumps(values, mask, [0, 1, 3])  # a new message starts at token 3, no observation between
  assert (stats.boundary_transitions, stats.boundary_jumps, stats.within_transitions, stats.within_jumps) == (
      1, 1, 2, 0)


def _reference_jumps(values, mask, boundaries, threshold=0.1):
  """A plain loop over tokens (float64)."""
  counts = [0, 0, 0, 0]  # boundary transitions, boundary jumps, within transitions, within jumps
  prev = None
  for t in range(len(mask)):
    if not mask[t]:
      continue
    if prev is not None:
      crosses = any(prev < b <= t for b in boundaries)
      jump = abs(values[t] - values[prev]) > threshold
      counts[0 if crosses else 2] += 1
      counts[1 if crosses else 3] += int(jump)
    prev = t
  return tuple(counts)


@pytest.mark.parametrize("seed", range(5))
def test_matches_a_plain_loop_on_random_traces(seed):
  rng = np.random.default_rng(seed)
  T = 300
  mask = rng.random(T) < 0.6
  mask[rng.integers(T)] = True
  boundaries = sorted(set(rng.choice(np.arange(1, T), 25, replace=False).tolist()) | {0})
  values = np.cumsum(rng.normal(0, 0.08, T))
  s = cd.value_jumps(values, mask, boundaries)
  assert (s.boundary_transitions, s.boundary_jumps, s.within_transitions, s.within_jumps) == _reference_jumps(
      values, mask, boundaries)
  assert s.boundary_transitions + s.within_transitions == mask.sum() - 1


def test_totals_reproduce_the_write_up_rates():
  # The write-up's totals: 1.86 % of 3,450 boundary vs 0.20 % of 955,928 within-turn transitions (≈ 9.2×).
  stats = cd.total_jumps([cd.JumpStats(3450, 64, 0, 0), cd.JumpStats(0, 0, 955_928, 1_930)])
  assert 100 * stats.boundary_rate == pytest.approx(1.86, abs=0.005)
  assert 100 * stats.within_rate == pytest.approx(0.20, abs=0.005)
  assert stats.ratio == pytest.approx(9.2, abs=0.1)
  assert "1.86 %" in cd.summarize_markdown(stats)


def test_success_beats_failure_pairs():
  mask = np.ones(4, bool)
  success = [(np.array([0.9, 0.95, 1.0, 1.0]), mask)] * 3
  failure = [(np.array([0.2, 0.1, 0.0, 0.0]), mask), (np.array([0.99] * 4), mask), (np.zeros(4), mask)]
  assert cd.success_beats_failure(list(zip(success, failure))) == (2, 3)


def test_errors_name_the_problem():
  with pytest.raises(ValueError, match="no action tokens"):
    cd.trace_summary(np.zeros(3), np.zeros(3, bool))
  with pytest.raises(ValueError, match="equal-length"):
    cd.trace_summary(np.zeros(3), np.ones(4, bool))
  with pytest.raises(ValueError, match="strictly increasing"):
    cd.value_jumps(np.zeros(4), np.ones(4, bool), [0, 2, 2])
  with pytest.raises(ValueError, match="non-finite"):
    cd.trace_summary(np.array([0.0, np.nan]), np.ones(2, bool))
