"""What the trainer accepts beyond the record's own contract: values its learner can take, given its config.

`Trajectory.validate(vocab_size)` checks what any record must satisfy (shapes, finite numbers, ids in vocabulary).
`ContentLimits.check` adds the bounds that depend on the trainer: a trajectory passing both can be batched and
trained on without overflow or non-finite arithmetic.

  length            num_tokens <= max_tokens (the learner's largest batch bucket): TOO_LONG.
  reward            |reward| <= max_abs_reward: OUT_OF_RANGE. Rewards are float32 in the batch and are squared in
                    whitening and the value loss; 1e39 is inf in float32.
  rollout log-probs min_logprob <= logp <= 0 on action tokens: OUT_OF_RANGE. The importance ratios are
                    exp(logp_θ − logp_rollout) with logp_θ <= 0, so logp_rollout >= −80 keeps every ratio below
                    e^80 ≈ 5.5e34, finite in float32 (exp overflows float32 above 88.7). A token sampled from the
                    policy with log-prob below −80 (probability < 1e−34) does not happen in practice.
  policy_version    <= the newest version the trainer has published (`max_policy_version`): FUTURE_POLICY. A
                    version from the future would train as perfectly fresh, and one >= 2^31 overflows the batch's
                    int32 field.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from sao.transport.trajectory import ReasonCode, Trajectory, TrajectoryError

# See the module docstring: the most negative rollout log-prob whose importance ratio stays finite in float32.
DEFAULT_MIN_LOGPROB = -80.0
DEFAULT_MAX_ABS_REWARD = 1e4


@dataclasses.dataclass(frozen=True)
class ContentLimits:
  """The trainer's bounds on a submitted trajectory (module docstring).

  Attributes:
    vocab_size: token ids must lie in [0, vocab_size).
    max_tokens: the most tokens (prompt + turns) of one trajectory: the learner's largest batch bucket.
    max_abs_reward: |reward| <= this.
    min_logprob: rollout log-probs of action tokens must be >= this (and <= 0).
  """
  vocab_size: int
  max_tokens: int
  max_abs_reward: float = DEFAULT_MAX_ABS_REWARD
  min_logprob: float = DEFAULT_MIN_LOGPROB

  def __post_init__(self):
    if self.vocab_size <= 0 or self.max_tokens <= 0:
      raise ValueError(f"ContentLimits: vocab_size and max_tokens must be > 0, got {self.vocab_size}, "
                       f"{self.max_tokens}")
    if not (math.isfinite(self.max_abs_reward) and self.max_abs_reward > 0):
      raise ValueError(f"ContentLimits.max_abs_reward must be finite and > 0, got {self.max_abs_reward}")
    if not (math.isfinite(self.min_logprob) and self.min_logprob < 0):
      raise ValueError(f"ContentLimits.min_logprob must be finite and < 0, got {self.min_logprob}")

  def check(self, traj: Trajectory, max_policy_version: int | None = None) -> None:
    """Raises `TrajectoryError` naming the first field the trainer cannot take; `max_policy_version` None skips
    the version bound (records read back from the log were bounded when they were accepted)."""
    if traj.num_tokens > self.max_tokens:
      raise TrajectoryError("token_ids", ReasonCode.TOO_LONG,
                            f"{traj.num_tokens} tokens, more than the trainer's largest batch bucket "
                            f"{self.max_tokens}")
    traj.validate(self.vocab_size)
    if abs(traj.reward) > self.max_abs_reward:
      raise TrajectoryError("reward", ReasonCode.OUT_OF_RANGE,
                            f"{traj.reward} outside [-{self.max_abs_reward}, {self.max_abs_reward}]")
    lp = traj.rollout_logprobs
    bad = np.flatnonzero(traj.action_mask & (lp < self.min_logprob))
    if bad.size:
      raise TrajectoryError("rollout_logprobs", ReasonCode.OUT_OF_RANGE,
                            f"log-prob {lp[bad[0]]} at position {bad[0]} below the minimum {self.min_logprob}")
    if max_policy_version is not None and traj.policy_version > max_policy_version:
      raise TrajectoryError("policy_version", ReasonCode.FUTURE_POLICY,
                            f"version {traj.policy_version} is newer than any the trainer published "
                            f"({max_policy_version})")
