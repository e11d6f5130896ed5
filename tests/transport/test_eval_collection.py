"""The eval collector alone: a version's result appears once all of its episodes returned, and survives a restart."""
import json

import pytest

from sao.transport.evaluation import EvalCollector


def test_result_waits_for_every_episode_and_reports_once():
  evals = EvalCollector(success_threshold=1.0)
  assert evals.start(3, num_tasks=3)
  assert not evals.start(3, num_tasks=3)  # once per version
  evals.record(3, "eval3:a", 1.0, "sao")
  evals.record(3, "eval3:b", 0.0, "sao")
  assert evals.pop() == [] and evals.result(3) is None
  evals.record(3, "eval3:c", 1.0, "other")
  [result] = evals.pop()
  assert (result.policy_version, result.num_tasks, result.num_success) == (3, 3, 2)
  assert result.success_rate == pytest.approx(2 / 3) and result.mean_reward == pytest.approx(2 / 3)
  assert result.by_harness == {"other": 1.0, "sao": 0.5}
  assert evals.pop() == [] and evals.result(3) == result
  assert not evals.start(3, num_tasks=3)  # a finished version is not evaluated again


def test_unknown_version_is_ignored_and_state_round_trips():
  evals = EvalCollector()
  evals.record(9, "eval9:a", 1.0, "")  # no run: warned, ignored
  assert evals.pop() == []
  evals.start(1, num_tasks=2)
  evals.record(1, "eval1:a", 1.0, "")
  restored = EvalCollector()
  restored.load_state_dict(json.loads(json.dumps(evals.state_dict())))
  restored.record(1, "eval1:b", 0.0, "")
  assert [r.success_rate for r in restored.pop()] == [0.5]
