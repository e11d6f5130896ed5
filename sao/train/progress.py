"""What the trainer reports per step: the progress row (the metrics `sao.analysis` reads back and the progress line
prints), the per-harness reward breakdown, and the validation summary of a finished run.

Pure functions of the step's trajectories and numbers the trainer hands in (the trainer, `sao.train.trainer`, owns
the writers; its phase's steps, `sao.train.phase_steps`, the clock), and `NoWriter`, the metric writer of the
processes other than 0.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from sao.transport.trajectory import Trajectory

# The columns of the printed progress line, in order.
PROGRESS_KEYS = ("reward", "validation", "turns", "response_length", "critic_ev", "staleness", "traj_per_s")


def per_harness_rewards(trajectories: Sequence[Trajectory]) -> dict[str, float]:
  """`reward/harness/<name>`: the batch's mean reward per harness (the mixed-harness experiment's breakdown)."""
  by_harness: dict[str, list[float]] = {}
  for t in trajectories:
    if t.harness:
      by_harness.setdefault(t.harness, []).append(t.reward)
  return {f"reward/harness/{h}": float(np.mean(r)) for h, r in sorted(by_harness.items())}


def progress_row(trajectories: Sequence[Trajectory], num_trainable: int, num_stale: int, num_unusable: int,
                 metrics: dict[str, float], validation: float, elapsed_s: float, wait_s: float,
                 policy_version: int) -> dict[str, float]:
  """One step's row: means over the step's `trajectories` (all taken, trainable or not), the learner's critic
  explained variance and staleness from `metrics` (NaN when the step made no update), throughput over `elapsed_s`
  since the previous row, the trajectories dropped (stale or not trainable) and quarantined, the seconds the trainer
  waited for its batch, and the policy version after the step."""
  return {
      "reward": float(np.mean([t.reward for t in trajectories])),
      "validation": validation,
      "turns": float(np.mean([t.num_turns for t in trajectories])),
      "response_length": float(np.mean([t.num_action_tokens for t in trajectories])),
      "critic_ev": metrics.get("critic/explained_variance", float("nan")),
      "staleness": metrics.get("batch/staleness_mean", float("nan")),
      "traj_per_s": len(trajectories) / max(elapsed_s, 1e-9),
      "dropped": float(len(trajectories) - num_trainable),
      "dropped_stale": float(num_stale),
      "quarantined": float(num_unusable),
      "trainer/wait_s": wait_s,
      "policy_version": float(policy_version),
  }


def step_scalars(metrics: dict[str, float], row: dict[str, float], trajectories: Sequence[Trajectory],
                 phase: str) -> dict[str, Any]:
  """The scalars written for a step: the learner's metrics, the row's finite entries, the per-harness rewards and
  `phase/<phase>` = 1."""
  return {**metrics, **{k: v for k, v in row.items() if np.isfinite(v)}, **per_harness_rewards(trajectories),
          "phase/" + phase: 1.0}


def progress_line(phase: str, step: int, row: dict[str, float]) -> str:
  return f"[{phase}] step {step:4d}  " + "  ".join(f"{k} {row[k]:.3f}" for k in PROGRESS_KEYS)


def validation_summary(validations: Sequence[tuple[int, float]]) -> tuple[float, float, float]:
  """(base policy's validation (version 0), mean of the last three trained versions' validations, best trained
  validation) from (policy version, success rate) pairs; NaN when not measured. The last-three mean is the honest
  "after" number: the best of many noisy evaluations is biased upwards."""
  base = [v for version, v in validations if version == 0]
  trained = [v for version, v in validations if version > 0]
  nan = float("nan")
  return ((base[0] if base else nan), (float(np.mean(trained[-3:])) if trained else nan),
          (max(trained) if trained else nan))


def validation_line(validations: Sequence[tuple[int, float]]) -> str:
  """The main job's closing words on validation (`validation_summary` of (policy version, success rate) pairs):
  `validation <base> (base policy) → <mean> (mean of the last 3 evaluations; best <best>)`. A run with fewer than
  three trained evaluations says how many it averaged, and a side never measured is named, never printed as nan."""
  base, final, best = validation_summary(validations)
  averaged = min(3, sum(version > 0 for version, _ in validations))
  before = "validation of the base policy not measured" if np.isnan(base) else f"validation {base:.3f} (base policy)"
  if not averaged:
    return f"{before}; no trained policy evaluated"
  after = "the only trained evaluation" if averaged == 1 else f"mean of the last {averaged} evaluations"
  return f"{before} → {final:.3f} ({after}; best {best:.3f})"


class NoWriter:
  """Metric writers of the processes other than 0 (which writes the job's metrics once)."""

  def write_scalars(self, step: int, scalars: Any) -> None:
    del step, scalars

  def flush(self) -> None:
    pass

  def close(self) -> None:
    pass
