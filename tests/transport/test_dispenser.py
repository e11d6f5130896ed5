"""Tests for the task dispenser: SAO and group leasing, epochs, lease expiry, evaluation schedule, checkpointing."""
import collections
import json

import numpy as np
import pytest

from sao.transport.dispenser import DispenserConfig, TaskDispenser
from sao.transport.trajectory import ReasonCode, Trajectory, TrajectoryError

TASKS = [{"id": f"task{i}", "prompt": f"p{i}"} for i in range(10)]
VAL = [{"id": f"val{i}"} for i in range(3)]


class FakeClock:
  """Injected time: tests advance it instead of sleeping."""

  def __init__(self):
    self.now = 1000.0

  def __call__(self) -> float:
    return self.now


def traj_for(lease, sample_index: int = 0, reward: float = 1.0) -> Trajectory:
  return Trajectory(task_id=lease.task_id, token_ids=[1, 2], action_mask=[0, 1], rollout_logprobs=[0, -0.1],
                    reward=reward, lease_id=lease.lease_id, sample_index=sample_index, group_id=lease.group_id)


def submit(d: TaskDispenser, lease, sample_index: int = 0, reward: float = 1.0) -> bool:
  traj = traj_for(lease, sample_index, reward)
  return d.complete(d.begin_submission(traj), traj)


def test_sao_one_sample_per_task_and_each_epoch_covers_every_task_once():
  d = TaskDispenser(TASKS, DispenserConfig(seed=3, num_epochs=2))
  leases = d.lease("w", 7) + d.lease("w", 100)
  assert len(leases) == 20 and d.lease("w", 5) == []
  assert all(l.sample_indices == (0,) and l.num_samples == 1 and not l.is_validation for l in leases)
  epoch0, epoch1 = [l.task_id for l in leases[:10]], [l.task_id for l in leases[10:]]
  assert sorted(epoch0) == sorted(epoch1) == sorted(t["id"] for t in TASKS)
  assert epoch0 != epoch1  # reshuffled per epoch
  assert json.loads(leases[0].task_json)["id"] == leases[0].task_id
  assert len({l.lease_id for l in leases}) == 20 and len({l.group_id for l in leases}) == 20
  for lease in leases:
    assert submit(d, lease)  # SAO: every sample completes its own group
  assert d.exhausted and d.num_leased == 0


def test_seed_changes_order():
  order = lambda seed: [l.task_id for l in TaskDispenser(TASKS, DispenserConfig(seed=seed)).lease("w", 10)]
  assert order(0) == order(0) and order(0) != order(1)


def test_group_mode_leases_g_samples_and_group_is_ready_only_when_all_arrive():
  d = TaskDispenser(TASKS, DispenserConfig(mode="group", group_size=4))
  (lease,) = d.lease("w", 1)
  assert lease.sample_indices == (0, 1, 2, 3) and lease.num_samples == 4
  assert [submit(d, lease, i) for i in (2, 0, 3)] == [False, False, False]
  assert d.num_leased == 1
  assert submit(d, lease, 1)
  assert d.num_leased == 0


def test_submission_checks_lease_sample_index_and_task():
  clock = FakeClock()
  d = TaskDispenser(TASKS, DispenserConfig(mode="group", group_size=2, lease_ttl_s=10), clock=clock)
  (lease,) = d.lease("w", 1)
  bad = [(dict(lease_id="nope"), ReasonCode.UNKNOWN_LEASE, "lease_id"),
         (dict(sample_index=2), ReasonCode.UNKNOWN_LEASE, "sample_index"),
         (dict(task_id="other"), ReasonCode.INVALID_FIELD, "task_id"),
         (dict(group_id="other"), ReasonCode.INVALID_FIELD, "group_id")]
  for overrides, code, field in bad:
    t = traj_for(lease)
    for k, v in overrides.items():
      setattr(t, k, v)
    with pytest.raises(TrajectoryError) as e:
      d.begin_submission(t)
    assert e.value.reason_code == code and e.value.field == field


def test_expired_lease_is_re_leased_with_missing_samples_and_late_submission_is_unknown():
  clock = FakeClock()
  d = TaskDispenser(TASKS, DispenserConfig(mode="group", group_size=3, lease_ttl_s=10, num_epochs=1), clock=clock)
  (dead,) = d.lease("dead-worker", 1)
  submit(d, dead, 1)
  clock.now += 11
  (again,) = d.lease("w2", 1)  # re-leases come before fresh tasks
  assert again.task_id == dead.task_id and again.group_id == dead.group_id and again.lease_id != dead.lease_id
  assert again.sample_indices == (0, 2)
  with pytest.raises(TrajectoryError) as e:  # the dead worker's late submission
    d.begin_submission(traj_for(dead, 0))
  assert e.value.reason_code == ReasonCode.UNKNOWN_LEASE
  assert not submit(d, again, 0) and submit(d, again, 2)  # the group completes from both leases


def test_no_task_lost_when_workers_die():
  clock = FakeClock()
  d = TaskDispenser(TASKS, DispenserConfig(lease_ttl_s=5, num_epochs=1), clock=clock)
  d.lease("dead", 4)
  clock.now += 6
  done = collections.Counter()
  for _ in range(20):  # bounded: a finite number of rounds suffices
    for lease in d.lease("alive", 3):
      submit(d, lease)
      done[lease.task_id] += 1
    if d.exhausted:
      break
  assert d.exhausted and done == collections.Counter(t["id"] for t in TASKS)


def test_heartbeat_extends_and_reports_expired():
  clock = FakeClock()
  d = TaskDispenser(TASKS, DispenserConfig(lease_ttl_s=10), clock=clock)
  a, b = d.lease("w", 2)
  clock.now += 8
  assert d.heartbeat([a.lease_id]) == ([a.lease_id], [])
  clock.now += 8  # a was extended to +18, b lapsed at +10
  assert d.heartbeat([a.lease_id, b.lease_id, "never"]) == ([a.lease_id], [b.lease_id, "never"])
  assert submit(d, a)


def test_submission_racing_expiry_still_counts_and_is_not_re_run():
  clock = FakeClock()
  d = TaskDispenser(TASKS, DispenserConfig(lease_ttl_s=10, num_epochs=1), clock=clock)
  (lease,) = d.lease("w", 1)
  traj = traj_for(lease)
  checked = d.begin_submission(traj)
  clock.now += 11
  d.heartbeat([])  # sweeps the lease into the re-lease queue
  assert d.complete(checked, traj)
  assert lease.task_id not in [l.task_id for l in d.lease("w", 100)]


def test_validation_schedule_and_success_rate():
  d = TaskDispenser(TASKS, DispenserConfig(eval_every=2, eval_temperature=0.0, train_temperature=0.7,
                                           success_threshold=1.0), validation_tasks=VAL)
  d.set_policy_version(1)
  assert all(not l.is_validation for l in d.lease("w", 2))
  d.set_policy_version(2)
  d.set_policy_version(2)  # scheduled once per version
  leases = d.lease("w", 5)
  evals = [l for l in leases if l.is_validation]
  assert sorted(l.task_id for l in evals) == ["val0", "val1", "val2"] and leases[:3] == evals
  assert all(l.temperature == 0.0 and l.eval_version == 2 and l.num_samples == 1 for l in evals)
  assert all(l.temperature == 0.7 for l in leases[3:])
  submit(d, evals[0], reward=1.0)
  submit(d, evals[1], reward=0.0)
  assert d.pop_eval_results() == [] and d.eval_result(2) is None
  submit(d, evals[2], reward=1.0)
  (result,) = d.pop_eval_results()
  assert result.policy_version == 2 and result.num_tasks == 3 and result.num_success == 2
  assert result.success_rate == pytest.approx(2 / 3) and result.mean_reward == pytest.approx(2 / 3)
  assert d.pop_eval_results() == [] and d.eval_result(2) == result


def test_state_dict_round_trip_continues_the_same_order():
  clock = FakeClock()
  cfg = DispenserConfig(mode="group", group_size=2, seed=5, lease_ttl_s=10, eval_every=1)
  a = TaskDispenser(TASKS, cfg, VAL, clock=clock)
  a.lease("w", 7)
  half = a.lease("w", 1)[0]
  submit(a, half, 0)
  a.set_policy_version(1)
  state = json.loads(json.dumps(a.state_dict()))  # must survive JSON (the trainer checkpoints it)
  b = TaskDispenser(TASKS, cfg, VAL, clock=clock)
  b.load_state_dict(state)
  assert b.policy_version == 1 and b.num_leased == a.num_leased
  # The outstanding half-done lease is still known to the restored dispenser and completes the group there.
  assert submit(b, b.lease_info(half.lease_id), 1)
  order = lambda d: [(l.task_id, l.group_id, l.sample_indices, l.is_validation) for l in d.lease("w", 25)]
  assert order(a) == order(b)
  with pytest.raises(ValueError, match="seed"):
    TaskDispenser(TASKS, DispenserConfig(mode="group", group_size=2, seed=6)).load_state_dict(state)


def test_config_and_task_errors_name_the_problem():
  with pytest.raises(ValueError, match="group_size"):
    DispenserConfig(mode="sao", group_size=4)
  with pytest.raises(ValueError, match="mode"):
    DispenserConfig(mode="ppo")
  with pytest.raises(ValueError, match="duplicate task id 'a'"):
    TaskDispenser([{"id": "a"}, {"id": "a"}])
  with pytest.raises(ValueError, match="no 'id' field"):
    TaskDispenser([{"name": "a"}])
  with pytest.raises(ValueError, match="not JSON-serialisable"):
    TaskDispenser([{"id": "a", "x": np.zeros(2)}])


def test_repeated_eval_runs_every_validation_task_that_many_times():
  d = TaskDispenser(TASKS, DispenserConfig(eval_every=0, success_threshold=1.0), validation_tasks=VAL)
  with pytest.raises(ValueError, match="repeats"):
    d.schedule_eval(0, repeats=0)
  assert d.schedule_eval(0, repeats=3) and not d.schedule_eval(0, repeats=3)
  evals = [l for l in d.lease("w", 20) if l.is_validation]
  assert collections.Counter(l.task_id for l in evals) == {"val0": 3, "val1": 3, "val2": 3}
  assert len({l.group_id for l in evals}) == 9
  state = d.state_dict()  # a checkpoint mid-evaluation keeps its size
  for i, lease in enumerate(evals[:-1]):
    submit(d, lease, reward=float(i % 3 == 0))  # 3 of the first 8 succeed
  assert d.pop_eval_results() == []
  submit(d, evals[-1], reward=1.0)
  (result,) = d.pop_eval_results()
  assert (result.policy_version, result.num_tasks, result.num_success) == (0, 9, 4)
  restored = TaskDispenser(TASKS, DispenserConfig(eval_every=0), validation_tasks=VAL)
  restored.load_state_dict(json.loads(json.dumps(state)))
  assert restored.state_dict()["eval_runs"]["0"]["num_tasks"] == 9
