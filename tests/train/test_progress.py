"""The trainer's per-step report (`sao.train.progress`): the row, the written scalars, the progress line, the
validation summary and the closing line on it."""
import dataclasses
import math

from sao.train import progress

from tests.train.helpers import trajectories


def test_row_scalars_and_line_of_a_step():
  trajs = trajectories(0, n=4)
  trajs = [dataclasses.replace(t, reward=r, harness=h) for t, r, h in
           zip(trajs, (1.0, 0.0, 1.0, 1.0), ("xml_json", "bash_only", "xml_json", ""))]
  metrics = {"critic/explained_variance": 0.5, "actor/loss": 0.25}
  row = progress.progress_row(trajs, num_trainable=3, num_stale=1, num_unusable=0, metrics=metrics,
                              validation=float("nan"), elapsed_s=2.0, wait_s=0.5, policy_version=7)
  assert row["reward"] == 0.75 and row["traj_per_s"] == 2.0 and row["critic_ev"] == 0.5
  assert (row["dropped"], row["dropped_stale"], row["quarantined"], row["policy_version"]) == (1.0, 1.0, 0.0, 7.0)
  assert math.isnan(row["staleness"]) and math.isnan(row["validation"])  # no such metric / not measured yet
  assert row["turns"] == sum(t.num_turns for t in trajs) / 4
  scalars = progress.step_scalars(metrics, row, trajs, "rl")
  assert scalars["actor/loss"] == 0.25 and scalars["phase/rl"] == 1.0
  assert "staleness" not in scalars and "validation" not in scalars  # NaN entries are not written
  assert scalars["reward/harness/xml_json"] == 1.0 and scalars["reward/harness/bash_only"] == 0.0
  assert "reward/harness/" not in scalars  # a trajectory without a harness name counts in no breakdown
  line = progress.progress_line("rl", 3, row)
  assert line.startswith("[rl] step    3  reward 0.750  validation nan  turns ")
  assert [w for w in line.split() if w in progress.PROGRESS_KEYS] == list(progress.PROGRESS_KEYS)


def test_validation_summary_is_base_last_three_mean_and_best():
  base, last3, best = progress.validation_summary([(0, 0.25), (2, 0.5), (4, 0.75), (6, 0.25), (8, 0.5)])
  assert (base, last3, best) == (0.25, 0.5, 0.75)
  assert all(math.isnan(v) for v in progress.validation_summary([]))


def test_validation_line_names_what_it_averaged_and_never_prints_nan():
  full = progress.validation_line([(0, 0.25), (2, 0.5), (4, 0.75), (6, 0.25), (8, 0.5)])
  assert full == "validation 0.250 (base policy) → 0.500 (mean of the last 3 evaluations; best 0.750)"
  assert progress.validation_line([(0, 0.25), (2, 0.5), (4, 0.75)]) == (
      "validation 0.250 (base policy) → 0.625 (mean of the last 2 evaluations; best 0.750)")
  assert progress.validation_line([(0, 0.25), (2, 0.5)]) == (
      "validation 0.250 (base policy) → 0.500 (the only trained evaluation; best 0.500)")
  assert progress.validation_line([(0, 0.25)]) == "validation 0.250 (base policy); no trained policy evaluated"
  assert progress.validation_line([]) == "validation of the base policy not measured; no trained policy evaluated"
  assert progress.validation_line([(3, 0.5)]) == (
      "validation of the base policy not measured → 0.500 (the only trained evaluation; best 0.500)")
  for validations in ([], [(0, 0.25)], [(0, 0.25), (2, 0.5)], [(5, 1.0)]):
    assert "nan" not in progress.validation_line(validations)
