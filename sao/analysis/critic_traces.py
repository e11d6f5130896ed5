"""Per-token critic traces: the trainer's periodic dump of one success and one failure trajectory, and its reader.

Every `critic_trace_every` SAO steps the trainer picks, from the batch it is about to train on, one trajectory with
reward > 0 ("success") and one with reward ≤ 0 ("failure") — uniformly at random among each kind, seeded by the
step — and appends one JSON line per pick to `<workdir>/critic_traces.jsonl` (`CriticTrace.to_json`), with the
critic's values *before* that step's critic update (the write-up's Figure 7 / Table 5 inspection):

    values[t]      V(x_<t): the critic's value of the state before token t ([T]; aligned as `sao.train.steps`)
    returns[t]     the critic's regression target R_t (Monte-Carlo return for γ = λ_critic = 1)
    advantages[t]  the actor's advantage Â_t (whitened when the recipe whitens)
    action_mask[t] 1 on model-action tokens; turn_boundaries: token offsets where each message starts

`sao.analysis.critic_diagnostics` computes ΔV, half means and boundary jump rates from these fields.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

import numpy as np

TRACES_FILE = "critic_traces.jsonl"
KINDS = ("success", "failure")


@dataclasses.dataclass
class CriticTrace:
  """One dumped trajectory with the critic's per-token view (arrays `[T]`)."""
  step: int
  kind: str  # "success" | "failure"
  reward: float
  policy_version: int
  task_id: str
  num_turns: int
  turn_boundaries: tuple[int, ...]
  action_mask: np.ndarray  # [T] bool
  values: np.ndarray  # [T] float
  returns: np.ndarray  # [T] float
  advantages: np.ndarray  # [T] float
  phase: str = "rl"

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"critic trace: kind {self.kind!r} is not one of {KINDS}")
    self.action_mask = np.asarray(self.action_mask, bool)
    self.turn_boundaries = tuple(int(b) for b in self.turn_boundaries)
    length = self.action_mask.shape
    for name in ("values", "returns", "advantages"):
      array = np.asarray(getattr(self, name), np.float64)
      if array.shape != length:
        raise ValueError(f"critic trace (step {self.step}, {self.kind}): {name} has shape {array.shape}, "
                         f"action_mask {length}")
      setattr(self, name, array)

  def to_json(self) -> str:
    record = {"step": int(self.step), "phase": self.phase, "kind": self.kind, "reward": float(self.reward),
              "policy_version": int(self.policy_version), "task_id": self.task_id, "num_turns": int(self.num_turns),
              "turn_boundaries": list(self.turn_boundaries), "action_mask": self.action_mask.astype(int).tolist()}
    for name in ("values", "returns", "advantages"):
      record[name] = [round(float(v), 6) for v in getattr(self, name)]
    return json.dumps(record)

  @classmethod
  def from_json(cls, line: str) -> "CriticTrace":
    record = json.loads(line)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in record and f.name != "phase"]
    if missing:
      raise ValueError(f"critic trace: missing field(s) {missing}")
    return cls(**{f.name: record[f.name] for f in dataclasses.fields(cls) if f.name in record})


def pick_rows(rewards: Sequence[float], seed: int) -> dict[str, int]:
  """One index per kind present: a uniformly random reward > 0 index ("success") and reward ≤ 0 ("failure")."""
  rewards = np.asarray(rewards, np.float64)
  rng = np.random.default_rng(seed)
  picks = {}
  for kind, chosen in (("success", rewards > 0), ("failure", ~(rewards > 0))):
    candidates = np.flatnonzero(chosen)
    if candidates.size:
      picks[kind] = int(rng.choice(candidates))
  return picks


class TraceWriter:
  """Appends traces to `<workdir>/critic_traces.jsonl`, fsynced per call (a crash loses at most the last line)."""

  def __init__(self, workdir: str):
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, TRACES_FILE)

  def write(self, traces: Sequence[CriticTrace]) -> None:
    if not traces:
      return
    with open(self.path, "a", encoding="utf-8") as f:
      f.write("".join(t.to_json() + "\n" for t in traces))
      f.flush()
      os.fsync(f.fileno())


def read_traces(path: str) -> list[CriticTrace]:
  """The traces of a file or a workdir, one per (step, kind) — the last written — in step order; a torn final line
  (crash mid-write) is ignored, other bad lines raise ValueError naming the line."""
  if os.path.isdir(path):
    path = os.path.join(path, TRACES_FILE)
  with open(path, encoding="utf-8") as f:
    lines = f.read().splitlines()
  traces = []
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      traces.append(CriticTrace.from_json(line))
    except (json.JSONDecodeError, TypeError, ValueError) as e:
      if i == len(lines) - 1 and isinstance(e, json.JSONDecodeError):
        break
      raise ValueError(f"{path}:{i + 1}: bad critic trace: {e}") from e
  # A run resumed from a checkpoint redoes the steps after it and dumps them again: the later dump wins.
  latest = {(t.step, t.kind): t for t in traces}
  return sorted(latest.values(), key=lambda t: (t.step, KINDS.index(t.kind)))


def pairs_by_step(traces: Sequence[CriticTrace]) -> list[tuple[CriticTrace, CriticTrace]]:
  """(success, failure) for every step that dumped both, in step order."""
  by_step: dict[int, dict[str, CriticTrace]] = {}
  for t in traces:
    by_step.setdefault(t.step, {})[t.kind] = t
  return [(kinds["success"], kinds["failure"]) for step, kinds in sorted(by_step.items()) if len(kinds) == 2]
