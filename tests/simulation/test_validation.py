"""Distributions, the flow-control functions the simulator shares with the server, and the bench comparison."""
from __future__ import annotations

import math

import numpy as np
import pytest

from sao.simulation import validation
from sao.simulation.distributions import Distribution, parse
from sao.transport import flow
from sao.transport.dispenser import TaskDispenser
from sao.transport.group_buffer import GroupBuffer
from sao.transport.leases import DispenserConfig
from sao.transport.trajectory import ReasonCode, Trajectory, TrajectoryError


def test_parse_and_errors():
  assert parse("constant:5") == Distribution("constant", 5.0)
  assert parse("lognormal:40,0.5,1,100") == Distribution("lognormal", 40.0, 0.5, 1.0, 100.0)
  assert parse("pareto:2,1.5,,20") == Distribution("pareto", 2.0, 1.5, hi=20.0)
  assert parse("choice:1,2") == Distribution("choice", values=(1.0, 2.0))
  for bad, match in (("gamma:1", "kind"), ("lognormal:0,1", "must be > 0"), ("constant:1,2,3,4", "at most"),
                     ("choice:", "finite values"), ("pareto:1,1,5,2", "lo 5.0 > hi")):
    with pytest.raises(ValueError, match=match):
      parse(bad)


def test_clipped_pareto_mean_is_exact():
  d = Distribution("pareto", 2.0, 1.5, hi=20.0)
  # 2 · (1 + (1 − 10^−0.5) / 0.5)
  assert d.mean() == pytest.approx(2.0 * (1.0 + (1.0 - 10 ** -0.5) / 0.5))
  draws = d.sample(np.random.default_rng(0), 400_000)
  assert draws.min() >= 2.0 and draws.max() <= 20.0
  assert float(draws.mean()) == pytest.approx(d.mean(), rel=0.02)


def test_cycle_replays_in_order():
  d = Distribution("cycle", values=(1.0, 5.0))
  rng = np.random.default_rng(0)
  assert [d.sample(rng) for _ in range(3)] + list(d.sample(rng, 3)) == [1.0, 5.0, 1.0, 5.0, 1.0, 5.0]


def test_lease_allowance():
  assert flow.lease_allowance(10, 0, 999, 8) == 10  # no flow control
  assert flow.lease_allowance(10, 32, 12, 1) == 10
  assert flow.lease_allowance(64, 32, 12, 1) == 20
  assert flow.lease_allowance(10, 64, 32, 8) == 4  # (64 − 32) // 8
  assert flow.lease_allowance(10, 32, 32, 8) == 0


def _traj(lease, index, version):
  return Trajectory(task_id=lease.task_id, token_ids=[1], action_mask=[True], rollout_logprobs=[-0.1], reward=0.0,
                    policy_version=version, sample_index=index, lease_id=lease.lease_id)


def test_admit_checks_staleness_before_room_and_releases_the_hold():
  dispenser = TaskDispenser([{"id": str(i)} for i in range(4)], DispenserConfig(mode="group", group_size=2))
  buffer = GroupBuffer(2)
  first, second = dispenser.lease("w", 2)
  with pytest.raises(TrajectoryError) as e:
    flow.admit(dispenser, buffer, _traj(first, 0, 1), "w", current_version=4, max_staleness=2)
  assert e.value.reason_code == ReasonCode.STALE_POLICY
  assert not dispenser.lease_info(first.lease_id).submitting  # the hold is released
  assert dispenser.lease_info(first.lease_id).pending == {1}  # the stale sample left its lease ...
  (again,) = dispenser.lease("w", 1)  # ... and is re-leased at once, ahead of fresh work
  assert (again.group_id, again.sample_indices) == (first.group_id, (0,))
  sample0 = _traj(again, 0, 2)
  lease = flow.admit(dispenser, buffer, sample0, "w", current_version=4, max_staleness=2)
  assert sample0.group_id == again.group_id  # filled in from the lease, as the stored record carries it
  assert buffer.occupancy == 2  # the whole group is reserved
  with pytest.raises(TrajectoryError) as e:
    flow.admit(dispenser, buffer, _traj(second, 0, 4), "w", current_version=4, max_staleness=2)
  assert e.value.reason_code == ReasonCode.BACKPRESSURE
  assert flow.accept(dispenser, buffer, lease, sample0) is True
  assert buffer.ready_count == 0  # the group waits for its second sample
  sample1 = _traj(first, 1, 3)
  lease = flow.admit(dispenser, buffer, sample1, "w", current_version=4, max_staleness=2)
  flow.accept(dispenser, buffer, lease, sample1)
  assert buffer.ready_count == 2


def test_is_fresh_is_the_trainers_test():
  assert flow.staleness(7, 5) == 2
  assert flow.is_fresh(7, 5, 2) and not flow.is_fresh(7, 4, 2)


def _measurement(**kw):
  m = dict(mode="async", concurrency=4, batch_size=4, steps=10, warmup_steps=1, max_outstanding=8, buffer_capacity=16,
           max_staleness=4, turns_mean=2.0, delay=dict(kind="pareto", alpha=1.5, scale_s=1.0, max_s=1.0),
           episode_s=[1.5, 1.5], generate_s_mean=0.2, tool_s_mean=0.0, total_s_mean=1.2, train_step_s=[0.5],
           warmup_train_step_s=[3.0], traj_per_s=1.0, busy=0.5, staleness_mean=1.0)
  m.update(kw)
  return m


def test_bench_config_takes_the_measured_inputs():
  c = validation.bench_config(_measurement())
  assert c.episode.setup_s.mean() == pytest.approx(1.0)  # the delay, capped at its scale: always 1 s
  assert c.episode.gen_s.mean() == pytest.approx(0.1)  # 0.2 s of engine time over 2 turns
  assert c.submit_latency_s == pytest.approx(0.3)  # lease-to-acceptance 1.5 s − the agent loop's 1.2 s
  assert (c.loops, c.batch_size, c.max_outstanding, c.warmup_steps, c.max_steps) == (4, 4, 8, 1, 11)
  with pytest.raises(ValueError, match="episode_s"):
    validation.bench_config({k: v for k, v in _measurement().items() if k != "episode_s"})
  with pytest.raises(ValueError, match="async"):
    validation.bench_config(_measurement(mode="sync"))


def test_predict_matches_a_hand_computed_pipeline():
  """4 loops, episodes of exactly 1.5 s (1 s delay, 2 turns of 0.1 s, 0.3 s to submit), steps of 1.2 s, batch 4:
  batch k is taken at 1.5(k+1) and trained until 1.5(k+1) + 1.2. Over steps 1..10 (step 0 is the warm-up): 40
  trajectories from 2.7 to 17.7 s (4 / 1.5 per second), busy 1.2 / 1.5. Step 0 leaves the version (actor warm-up);
  step j >= 1 publishes version j at 1.5j + 2.7. Batch k's episodes are stamped at 1.5k + 1.1 (version k − 2, or 0)
  and taken at 1.5k + 1.5 (version k − 1, or 0): staleness 0 for batch 1, 1 for batches 2..10, mean 0.9."""
  p = validation.predict(_measurement(train_step_s=[1.2], warmup_train_step_s=[]), seeds=range(2))
  assert p["traj_per_s"] == pytest.approx(4 / 1.5, rel=1e-6)
  assert p["busy"] == pytest.approx(0.8, rel=1e-6)
  assert p["staleness_mean"] == pytest.approx(0.9, rel=1e-6)


def test_compare_and_relative_error():
  rows = validation.compare({"traj_per_s": 1.1, "busy": 0.5, "staleness_mean": 0.0, "staleness_steady_mean": 1.0},
                            {"traj_per_s": 1.0, "busy": 0.4, "staleness_mean": 0.0, "staleness_steady_mean": 0.5})
  assert [round(r.relative_error, 6) for r in rows] == [0.1, 0.25, 0.0, 1.0]
  assert [r.within(0.2) for r in rows] == [True, False, True, False]
  assert math.isinf(validation.Comparison("x", 1.0, 0.0).relative_error)
  with pytest.raises(ValueError, match="missing"):
    validation.compare({"busy": 1.0}, {"busy": 1.0})
  table = validation.format_table([("16 loops", rows)], 0.2)
  assert "| 16 loops | busy | 0.500 | 0.400 | 25.0% | NO |" in table


def test_bench_config_uses_the_steady_state_trajectories():
  """With per-trajectory records, the agent loop's timings come from trajectories leased in the measured window
  (leased_at >= 0): the first episodes' engine calls, slowed by its compilations, do not count."""
  early = [dict(leased_at=-5.0, accepted_at=20.0, turns=2, generate_s=20.0, tool_s=0.0, total_s=24.0)] * 8
  steady = [dict(leased_at=float(i), accepted_at=i + 1.6, turns=2, generate_s=0.4, tool_s=0.2, total_s=1.5)
            for i in range(40)]
  m = _measurement(taken=early + steady)
  timings = validation.steady_state_timings(m)
  assert timings["trajectories"] == 40 and timings["lease_to_accept_s"] == pytest.approx(1.6)
  c = validation.bench_config(m)
  assert c.episode.gen_s.mean() == pytest.approx(0.2) and c.episode.tool_s.mean() == pytest.approx(0.1)
  assert c.submit_latency_s == pytest.approx(0.1)  # 1.6 s lease-to-acceptance − the loop's 1.5 s
  assert validation.steady_state_timings(_measurement(taken=early + steady[:3])) is None  # too few: the means
  # The steady-state staleness is the bench's count (server version − policy version at the take) over them.
  versions = [dict(t, server_version=5, policy_version=5 - (i % 2)) for i, t in enumerate(steady)]
  observed = validation.measured_metrics(_measurement(taken=[dict(t, server_version=9, policy_version=0)
                                                             for t in early] + versions))
  assert observed["staleness_steady_mean"] == pytest.approx(0.5) and observed["staleness_mean"] == 1.0
  assert "staleness_steady_mean" not in validation.measured_metrics(_measurement())
  assert validation.bench_config(_measurement(taken=early)).episode.gen_s.mean() == pytest.approx(0.1)


def test_engine_publish_fraction_charges_each_report_to_the_step_that_sent_it():
  """Back-to-back steps (a busy trainer): the engine's report of a version comes ~10 ms after the step that published
  it ended, inside the next step. It counts for the publishing step (capped at that publish's end), not as ~0 of
  the next one; a report of a warm-up step's publish counts for none."""
  timeline = dict(waits=[(-3.0, -2.0), (0.0, 0.0), (2.0, 2.0), (4.0, 4.5)], end=6.5,
                  publishes=[(-0.2, -0.05), (1.9, 1.98), (3.9, 3.98), (6.4, 6.48)],
                  engine_versions=[(0.01, 1), (1.99, 2), (4.01, 3), (6.45, 4)])
  expected = (1.98 / 2 + 1.98 / 2 + 1.95 / 2) / 3  # capped at 1.98 twice; 6.45 within its publish
  assert validation.engine_publish_fraction(timeline) == pytest.approx(expected)
  busy = _measurement(timeline=timeline, publish_fraction_mean=0.99, engine_publish_fraction_mean=0.5)
  assert validation.bench_config(busy).engine_publish_fraction == pytest.approx(expected)
  # Without the publish records: the bench's own mean (capped at the server's fraction).
  no_records = _measurement(publish_fraction_mean=0.99, engine_publish_fraction_mean=0.5)
  assert validation.bench_config(no_records).engine_publish_fraction == pytest.approx(0.5)
  assert validation.engine_publish_fraction(dict(timeline, engine_versions=[(0.01, 1)])) is None


def test_trimmed_keeps_what_the_validation_reads_and_rounds_the_rest():
  record = dict(step=3, leased_at=0.123456789, accepted_at=1.5, taken_at=2.0, policy_version=1, server_version=2,
                turns=2, generate_s=0.2, tool_s=0.0, total_s=1.2)
  full = _measurement(staleness=[1, 2], publish_s=[0.1], wall_s=9.0, taken=[record] * 40,
                      timeline=dict(waits=[[0.0, 0.5]], end=20.0, first_lease=0.0, publishes=[], engine_versions=[]),
                      loadavg_before=[1.0, 1.0, 1.0], loadavg_after=[2.0, 2.0, 2.0])
  trim = validation.trimmed(full)
  assert "staleness" not in trim and "publish_s" not in trim and "wall_s" not in trim
  assert set(trim["taken"][0]) == set(validation.READ_RECORD_KEYS) and trim["taken"][0]["leased_at"] == 0.123457
  assert trim["timeline"] == full["timeline"] and trim["delay"] == full["delay"]
  assert validation.measured_metrics(trim) == validation.measured_metrics(full)
  assert validation.predict(trim, seeds=range(2)) == pytest.approx(validation.predict(full, seeds=range(2)), rel=1e-3)
