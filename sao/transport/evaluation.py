"""Evaluation collection: the validation results of each policy version, gathered as its eval episodes return.

The dispenser (`sao.transport.dispenser`) queues a version's validation split as leases; every accepted validation
trajectory is recorded here (never in the training buffer). A version's `EvalResult` is ready once all of its
`num_tasks` episodes returned: success rate (reward >= `success_threshold`), mean reward, and the success rate per
harness. Pure Python, not thread-safe: the dispenser calls it under its own lock.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping

import numpy as np

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EvalResult:
  """Validation outcome of one policy version (all of its eval tasks returned)."""
  policy_version: int
  num_tasks: int
  num_success: int
  success_rate: float
  mean_reward: float
  by_harness: Mapping[str, float] = dataclasses.field(default_factory=dict)  # harness -> its success rate


@dataclasses.dataclass
class _EvalRun:
  num_tasks: int
  rewards: dict[str, float] = dataclasses.field(default_factory=dict)  # group id -> reward
  harnesses: dict[str, str] = dataclasses.field(default_factory=dict)  # group id -> the harness it ran through


class EvalCollector:
  """Open evaluation runs (one per policy version) and the finished results.

  Args:
    success_threshold: an eval episode succeeded when its reward >= this.
  """

  def __init__(self, success_threshold: float = 1.0):
    self.success_threshold = success_threshold
    self._runs: dict[int, _EvalRun] = {}
    self._done: dict[int, EvalResult] = {}
    self._unreported: list[EvalResult] = []

  def start(self, version: int, num_tasks: int) -> bool:
    """Opens the run of `version` expecting `num_tasks` episodes; False if that version was already started."""
    if num_tasks < 1:
      raise ValueError(f"num_tasks: must be >= 1, got {num_tasks}")
    if version in self._runs or version in self._done:
      return False
    self._runs[version] = _EvalRun(num_tasks)
    return True

  def record(self, version: int, group_id: str, reward: float, harness: str) -> None:
    """Records one returned eval episode (`group_id` is unique per episode); finishes the run when it is the last."""
    run = self._runs.get(version)
    if run is None:
      logger.warning("eval trajectory for version %d without an eval run; ignored", version)
      return
    run.rewards[group_id] = reward
    run.harnesses[group_id] = harness
    if len(run.rewards) < run.num_tasks:
      return
    rewards = np.asarray(list(run.rewards.values()), np.float64)
    success = int((rewards >= self.success_threshold).sum())
    by_harness: dict[str, list[bool]] = {}
    for gid, reward_ in run.rewards.items():
      by_harness.setdefault(run.harnesses.get(gid, ""), []).append(reward_ >= self.success_threshold)
    result = EvalResult(version, run.num_tasks, success, success / run.num_tasks, float(rewards.mean()),
                        {h: float(np.mean(v)) for h, v in sorted(by_harness.items())})
    del self._runs[version]
    self._done[version] = result
    self._unreported.append(result)
    logger.info("eval of policy version %d: success rate %.4f over %d tasks", version, result.success_rate,
                result.num_tasks)

  def pop(self) -> list[EvalResult]:
    """Results finished since the last call, in completion order."""
    out, self._unreported = self._unreported, []
    return out

  def result(self, version: int) -> EvalResult | None:
    return self._done.get(version)

  def state_dict(self) -> dict[str, Any]:
    """JSON-serialisable: the open runs with what returned so far, and the finished results."""
    return {"eval_runs": {str(v): {"num_tasks": r.num_tasks, "rewards": r.rewards, "harnesses": r.harnesses}
                          for v, r in self._runs.items()},
            "eval_done": [dataclasses.asdict(r) for r in self._done.values()]}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    self._runs = {int(v): _EvalRun(r["num_tasks"], dict(r["rewards"]), dict(r.get("harnesses", {})))
                  for v, r in state["eval_runs"].items()}
    self._done = {int(r["policy_version"]): EvalResult(**r) for r in state["eval_done"]}
    self._unreported = []
