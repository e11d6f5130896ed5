"""The engine slowed while the trainer computes: the clock's arithmetic, its effect on a simulated fleet, the no-op
case, and the factor's derivation from a bench record."""
from __future__ import annotations

import pytest

from sao.simulation import bench_contention, validation
from sao.simulation.contention import EngineClock
from sao.simulation.distributions import Distribution
from sao.simulation.fleet import simulate
from sao.simulation.model import EpisodeModel, FleetConfig
from sao.simulation.stalls import StallModel, StallSchedule
from tests.simulation.test_fleet import _heavy_tailed
from tests.simulation.test_validation import _measurement


def _const(x):
  return Distribution("constant", x)


def test_turns_slow_only_inside_the_trainers_steps():
  """The trainer computes in [2, 4]; a turn's engine seconds take twice as long there, and nowhere else."""
  clock = EngineClock(None, contention=2.0)
  clock.add_busy(2.0, 4.0)
  assert clock.finish(0.0, 1.0) == 1.0  # before the step
  assert clock.finish(1.0, 1.0) == 2.0  # ends as the step starts
  assert clock.finish(1.5, 1.0) == 3.0  # 0.5 s before it, the other 0.5 engine-seconds take 1 s in it
  assert clock.finish(2.0, 1.0) == 4.0  # wholly inside: twice as long
  assert clock.finish(3.0, 1.0) == 4.5  # 1 s in the step (0.5 engine-seconds), the rest after it
  assert clock.finish(4.0, 1.0) == 5.0 and clock.finish(0.5, 4.0) == 5.5  # after it; across it
  # Turns: the tool call (3 to 3.5) runs at full speed, the second generation does 0.25 in the step, 0.25 after.
  assert clock.run(1.5, [1.0, 0.5], [0.5, 0.0]) == 4.25
  # A later step, back to back with the last one (rounding included), joins it; one before it is an error.
  clock.add_busy(4.0, 5.0)
  assert clock.finish(3.0, 1.0) == 5.0
  clock.add_busy(8.0, 8.0)  # an empty step changes nothing
  assert clock.finish(7.5, 1.0) == 8.5
  with pytest.raises(ValueError, match="before the last"):
    clock.add_busy(1.0, 9.0)
  with pytest.raises(ValueError, match="> 0"):
    EngineClock(None, contention=0.0)
  # With a stall in the step [2, 4] as well: nothing is served in [2.5, 3], half speed in the rest of the step.
  stalled = EngineClock(StallSchedule(StallModel(intervals=((2.5, 3.0),)), seed=0), contention=2.0)
  stalled.add_busy(2.0, 4.0)
  assert stalled.finish(2.0, 1.0) == 4.25  # 0.25 by 2.5, stalled to 3, 0.5 more by 4, the last 0.25 after
  assert stalled.finish(1.0, 0.5) == 1.5 and stalled.finish(2.6, 0.1) == pytest.approx(3.2)


def _two_loops(contention=1.0, setup=0.0, loops=2):
  """Two loops, batch 1, steps of 0.5 s; episodes of one generation of 1, 2, 1, 2, ... engine-seconds in start
  order after `setup` s."""
  episode = EpisodeModel(setup_s=_const(setup), turns=_const(1), gen_s=Distribution("cycle", values=(1.0, 2.0)),
                         tool_s=_const(0.0))
  return FleetConfig(loops=loops, episode=episode, step_s=_const(0.5), batch_size=1, max_outstanding=0,
                     buffer_capacity=4, num_tasks=10, max_steps=2, trainer_contention=contention)


def test_a_step_slows_the_generations_in_flight():
  """A (1 s) and B (2 s) start at 0. A ends at 1, the trainer takes it and computes to 1.5, and C (1 s) starts. At
  half speed in the step, B has 0.75 s of work left at 1.5 and ends at 2.25 (not 2); so does C (0.25 done in the
  step). The trainer takes B at 2.25 and stops after that step, at 2.75; D and E are still running."""
  slowed = simulate(_two_loops(contention=2.0))
  assert slowed.sim_s == pytest.approx(2.75) and slowed.steps == 2
  assert slowed.episode_s == pytest.approx(1.0 + 2.25 + 1.25)
  clean = simulate(_two_loops())  # B and C end at 2: the second take is at 2, the run ends at 2.5
  assert clean.sim_s == pytest.approx(2.5) and clean.episode_s == pytest.approx(1.0 + 2.0 + 1.0)
  assert slowed.unaccounted() == 0 == clean.unaccounted()


def test_generations_outside_the_steps_are_not_slowed():
  """One loop and a 1 s setup: each generation starts after the 0.5 s step its take began (A: 1-2, step 2-2.5, B:
  3-5, step 5-5.5), so every event is where it was."""
  slowed = simulate(_two_loops(contention=2.0, setup=1.0, loops=1))
  assert slowed.summary() == simulate(_two_loops(setup=1.0, loops=1)).summary() and slowed.sim_s == 5.5


def test_without_contention_the_simulator_is_unchanged():
  """trainer_contention = 1 (the default) gives the numbers this run gave before contention existed (seed 3, the
  same pinned values as tests/simulation/test_stalls.py)."""
  r = simulate(_heavy_tailed(seed=3, trainer_contention=1.0))
  summary = r.summary()
  expected = dict(steps=60, trained=229, dispatched=743, final_version=47, stale_rejected=228, dropped_stale=258,
                  staleness={"0": 28, "1": 202, "2": 243, "3": 15})
  assert {k: summary[k] for k in expected} == expected
  assert (r.loop_busy_s, r.episode_s, r.waiting_s) == pytest.approx(
      (17276.895905185105, 16821.98930813367, 232.03496926131334), rel=1e-9)
  slowed = simulate(_heavy_tailed(seed=3, trainer_contention=3.0))
  assert slowed.unaccounted() == 0 and slowed.summary() != summary
  with pytest.raises(ValueError, match="trainer_contention"):
    _heavy_tailed(trainer_contention=0.0)


def _contention_record(busy=8):
  """Steps [-4, -3.5] (the warm-up), [15, 20], [25, 30], [35, 40]. In the window: 40 idle trajectories (turns
  0.95-1 s after the lease, before the first step; 0.05 s in the engine over 5 turns: 0.01 s a turn), `busy` whose
  turns lie in the first step (0.02 s a turn), one straddling its start and one stalled in it (neither counts), and
  a warm-up one in it (leased before the window: does not count)."""
  def row(leased, total, gen, turns=5):
    return dict(leased_at=leased, total_s=total, generate_s=gen, tool_s=0.0, turns=turns, accepted_at=leased + total,
                server_version=1, policy_version=1)
  idle = [row(0.1 * i, 1.0, 0.05) for i in range(40)]
  inside = [row(14.0 + 0.2 * j, 2.0, 0.1) for j in range(busy)]
  others = [row(13.0, 2.05, 0.1), row(14.0, 2.0, 5.0), row(-1.0, 17.0, 0.5)]
  return _measurement(taken=idle + inside + others,
                      timeline=dict(waits=[(-5.0, -4.0), (-3.5, 15.0), (20.0, 25.0), (30.0, 35.0)], end=40.0))


def test_engine_speed_is_derived_from_the_turns_inside_and_outside_the_steps():
  m = _contention_record()
  assert bench_contention.training_steps(m) == [(-4.0, -3.5), (15.0, 20.0), (25.0, 30.0), (35.0, 40.0)]
  speed = bench_contention.engine_speed(m, max_engine_s=0.25)
  assert (speed.idle_n, speed.busy_n) == (40, 8)
  assert (speed.idle_s, speed.busy_s, speed.contention) == pytest.approx((0.01, 0.02, 2.0))
  # The twin: the idle turns' engine time, slowed by the factor in its trainer's steps; without: one speed, the
  # mean over every unstalled steady-state trajectory (the straddling one's 0.1 s included).
  config = validation.bench_config(m)
  assert config.trainer_contention == pytest.approx(2.0) and config.episode.gen_s.mean() == pytest.approx(0.01)
  plain = validation.bench_config(m, contention=False)
  assert plain.trainer_contention == 1.0
  assert plain.episode.gen_s.mean() == pytest.approx((40 * 0.05 + 9 * 0.1) / 49 / 5)
  # Too few busy trajectories, or no steps' timeline: no factor.
  assert bench_contention.engine_speed(_contention_record(busy=7), 0.25) is None
  assert validation.bench_config(_contention_record(busy=7)).trainer_contention == 1.0
  no_timeline = dict(m)
  del no_timeline["timeline"]
  assert bench_contention.engine_speed(no_timeline, 0.25) is None
  with pytest.raises(ValueError, match="timeline"):
    bench_contention.training_steps(no_timeline)
  report = validation.simulate_bench(m, seed=0)
  assert report.measured_steps == 10 and report.unaccounted() == 0
