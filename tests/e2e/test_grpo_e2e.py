"""GRPO end to end through every process: `experiments/train.py` with `grpo_openswe.py:toy` shrunk to a few RL steps
(trainer + local engine + rollout worker subprocesses over gRPC): groups of G samples per task are leased, logged
and trained on whole, the actor steps with the token-level PPO clip, and metrics land in `metrics.jsonl`,
TensorBoard and `curves.png`. The run helpers are `test_train_e2e`'s."""
from __future__ import annotations

import collections
import os

import pytest

from sao.analysis import critic_traces
from sao.transport import log as log_lib
from tests.e2e.test_train_e2e import BATCH, COMMON, Run, _check_outputs, _metrics, _records
from tests.e2e.test_train_e2e import cache_dir, runs  # noqa: F401  (fixtures)  pylint: disable=unused-import

pytestmark = pytest.mark.slow

GROUP = 4  # G; BATCH = 2 tasks × 4 samples
STEPS = 4  # step 0 publishes v1; later steps' groups are sampled from it (with 3, a fast machine sampled all from v0)
# The shared tiny settings; one base validation pass of the 2 validation tasks instead of 4.
ARG = f"grpo_openswe.py:toy,total_steps={STEPS},rollout.group_size={GROUP},{COMMON},rollout.base_eval_repeats=1"


def test_grpo_end_to_end(tmp_path, runs, cache_dir):  # pylint: disable=redefined-outer-name
  workdir = str(tmp_path / "run")
  run = Run(ARG, workdir, cache_dir, "grpo")
  runs.append(run)
  out = run.finish(600)
  assert "[value pretraining]" not in out, "GRPO has no critic to pretrain"
  rows = _check_outputs(workdir)
  steps = [r for r in rows if "reward" in r]
  assert [r["step"] for r in steps] == list(range(STEPS)), [r.get("step") for r in steps]
  for r in steps:
    assert r["batch/num_trajectories"] == BATCH, r
    assert 0.0 <= r["actor/clip_fraction"] <= 1.0 and r["actor/skipped"] == 0, r
    assert not any(k.startswith("critic/") for k in r), "GRPO has no critic"
    # The 5-step warm start rarely solves a task: a batch whose groups all have equal rewards has Â = 0 and exactly
    # no gradient; one with a mixed group moves the policy.
    assert (r["actor/grad_norm"] > 0) == (r["advantages/std"] > 0), r
  # Every group the learner trained on is complete: G samples 0..G-1 of one task (whatever lease each came under).
  consumed = log_lib.read_consumed(os.path.join(workdir, "trajectories"))
  assert len(consumed) == STEPS * BATCH
  records = _records(workdir)
  groups, trained, tasks = collections.defaultdict(set), collections.defaultdict(set), collections.defaultdict(set)
  for rec in records:
    traj = rec.trajectory
    groups[traj.group_id].add(traj.sample_index)
    if rec.key in consumed:
      trained[traj.group_id].add(traj.sample_index)
      tasks[traj.group_id].add(traj.task_id)
  assert all(idx <= set(range(GROUP)) for idx in groups.values()), dict(groups)
  assert len(trained) == STEPS * BATCH // GROUP, dict(trained)
  assert all(idx == set(range(GROUP)) for idx in trained.values()), dict(trained)
  assert all(len(t) == 1 for t in tasks.values()), dict(tasks)
  assert not os.path.exists(os.path.join(workdir, critic_traces.TRACES_FILE)), "GRPO has no critic to trace"
