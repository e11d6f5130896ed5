"""Engine stalls: the schedule's arithmetic, their effect on a simulated fleet, and their derivation from a bench."""
from __future__ import annotations

import math

import pytest

from sao.simulation import bench_stalls, validation
from sao.simulation.distributions import Distribution
from sao.simulation.fleet import simulate
from sao.simulation.model import EpisodeModel, FleetConfig
from sao.simulation.stalls import StallModel, StallSchedule, merge
from tests.simulation.test_fleet import _heavy_tailed
from tests.simulation.test_validation import _measurement


def _const(x):
  return Distribution("constant", x)


def _schedule(*intervals):
  return StallSchedule(StallModel(intervals=intervals), seed=0)


def test_a_generation_waits_out_the_stalls_it_meets():
  s = _schedule((2.0, 4.0), (5.0, 6.0))
  assert s.finish(1.0, 0.5) == 1.5  # done before the stall
  assert s.finish(1.5, 1.0) == 4.5  # 0.5 s served, then the rest after the stall
  assert s.finish(3.0, 0.2) == pytest.approx(4.2)  # starts in the stall: waits for its end
  assert s.finish(3.0, 0.0) == 4.0  # even a request with nothing to compute waits
  assert s.finish(4.0, 0.5) == 4.5
  assert s.finish(1.0, 2.5) == pytest.approx(6.5)  # 1 s, stall, 1 s, stall, 0.5 s
  assert s.finish(6.0, 1.0) == 7.0
  # Turns: engine seconds through the stalls, tool seconds straight on (0.5 s served + 2 s stall + 0.5 s; tool to
  # 5.5, which is in the second stall: the second turn waits until 6).
  assert s.run(1.5, [1.0, 1.0], [1.0, 0.0]) == pytest.approx(7.0)
  assert s.stalled_s(0.0, 10.0) == 3.0 and s.stalled_s(3.0, 5.5) == 1.5
  assert s.overlaps(4.5, 5.0) and not s.overlaps(4.0, 4.9) and not s.overlaps(0.0, 1.9)


def test_merge_and_bad_models():
  assert merge([(5.0, 6.0), (1.0, 2.0), (1.5, 3.0), (3.0, 4.0)]) == [(1.0, 4.0), (5.0, 6.0)]
  for kwargs, match in ((dict(intervals=((2.0, 1.0),)), "start < end"), (dict(intervals=((-1.0, 1.0),)), "0 <="),
                        (dict(intervals=((0.0, math.inf),)), "finite"), (dict(gap_s=_const(1.0)), "both"),
                        (dict(gap_s=_const(0.0), duration_s=_const(1.0)), "positive mean")):
    with pytest.raises(ValueError, match=match):
      StallModel(**kwargs)
  assert not StallModel().active and StallModel(intervals=((0.0, 1.0),)).active


def test_a_stall_process_is_drawn_from_its_own_stream():
  """Gaps of 10 s and stalls of 2 s: stalls at [10, 12], [22, 24], ...; explicit ones merge with them."""
  s = StallSchedule(StallModel(intervals=((11.0, 13.0),), gap_s=_const(10.0), duration_s=_const(2.0)), seed=0)
  assert s.finish(9.0, 3.0) == 15.0  # 1 s served, stalled 10-13 (the two merged), 2 s more
  assert s.stalled_s(0.0, 100.0) == pytest.approx(3.0 + 7 * 2.0)  # [10, 13], then [22, 24] ... [94, 96]
  assert s.finish(1000.0, 1.0) == 1001.0  # [994, 996] and [1006, 1008]: drawn as far as asked
  random = StallModel(gap_s=Distribution("lognormal", 30.0, 0.5), duration_s=Distribution("lognormal", 3.0, 0.5))
  a, b, c = (StallSchedule(random, seed) for seed in (1, 1, 2))
  assert a.finish(500.0, 50.0) == b.finish(500.0, 50.0) != c.finish(500.0, 50.0)
  # The episodes' and steps' draws do not move: a process whose first stall comes after the run (its first gap,
  # drawn when the run starts) changes nothing.
  late = StallModel(gap_s=Distribution("lognormal", 1e6, 0.1), duration_s=_const(1.0))
  assert simulate(_heavy_tailed(seed=3, stalls=late)).summary() == simulate(_heavy_tailed(seed=3)).summary()


def _one_turn_fleet(stall=(), turns=1):
  """4 loops, episodes of `turns` generations of 1/turns s (no setup, no tools): every loop ends an episode every
  second; a fast trainer (batch 4, 0.1 s steps) takes them as they come. Run for 20.5 s."""
  episode = EpisodeModel(setup_s=_const(0.0), turns=_const(turns), gen_s=_const(1.0 / turns), tool_s=_const(0.0))
  return FleetConfig(loops=4, episode=episode, step_s=_const(0.1), batch_size=4, max_outstanding=0,
                     buffer_capacity=8, num_tasks=100, max_hours=20.5 / 3600, stalls=StallModel(intervals=stall))


@pytest.mark.parametrize("turns,stall", [(1, (2.5, 4.5)), (2, (2.25, 4.25)), (2, (2.75, 4.75))])
def test_a_stall_delays_every_turn_in_flight_and_costs_its_share(turns, stall):
  """Without a stall: 20 episodes per loop by 20.5 s. A stall of 2 s that starts half-way into the episodes begun
  at 2 s (into their first turn, or, with two turns, into the first or the second) delays all four by its 2 s: they
  end at 5 s, not 3 s, and the fleet trains 2 / 20 fewer trajectories."""
  clean = simulate(_one_turn_fleet(turns=turns))
  stalled = simulate(_one_turn_fleet((stall,), turns))
  assert clean.trained == 80 and clean.episode_s == pytest.approx(80.0)
  assert stalled.trained == 72 == clean.trained * (1 - 2.0 / 20.0)
  assert stalled.episode_s == pytest.approx(68 * 1.0 + 4 * 3.0)  # four episodes of 3 s, the rest of 1 s
  assert stalled.unaccounted() == 0


@pytest.mark.parametrize("group_size", [1, 4])
def test_without_stalls_the_simulator_is_unchanged(group_size):
  """The numbers this run gave before stalls existed (seed 3), and a stall that never comes changes nothing."""
  kwargs = {} if group_size == 1 else dict(max_outstanding=16, max_staleness=100)
  r = simulate(_heavy_tailed(group_size=group_size, seed=3, **kwargs))
  expected = {1: dict(steps=60, trained=229, dispatched=743, final_version=47, stale_rejected=228, dropped_stale=258,
                      staleness={"0": 28, "1": 202, "2": 243, "3": 15}),
              4: dict(steps=36, trained=288, dispatched=312, final_version=36, stale_rejected=0, dropped_stale=0,
                      staleness={"0": 10, "1": 77, "2": 171, "3": 26, "4": 9, "5": 3})}[group_size]
  summary = r.summary()
  assert {k: summary[k] for k in expected} == expected
  loop_busy, episode, waiting = {1: (17276.895905185105, 16821.98930813367, 232.03496926131334),
                                 4: (6350.763393207849, 6235.571214085767, 362.07500058133814)}[group_size]
  assert (r.loop_busy_s, r.episode_s, r.waiting_s) == pytest.approx((loop_busy, episode, waiting), rel=1e-9)
  never = simulate(_heavy_tailed(group_size=group_size, seed=3, stalls=StallModel(intervals=((5000.0, 5001.0),)),
                                 **kwargs))
  assert never.summary() == summary


def _stall_records():
  """A bench record (times from the first measured step's wait; the first lease at −10 s): 40 unstalled
  trajectories (0.05 s in the engine over 5 turns, so 0.01 s per turn) ending at −5 s and in the window; three
  stalled ones: A (engine −7 to −2 s), B (−4.5 to −1.5 s) and, in the window, C (3 to 5 s)."""
  unstalled = [dict(leased_at=-10.0 if i == 0 else float(i), total_s=5.0, generate_s=0.05, tool_s=0.0, turns=5,
                    accepted_at=(-10.0 if i == 0 else float(i)) + 5.01, server_version=1, policy_version=1)
               for i in range(40)]
  stalled = [dict(leased_at=-10.0, total_s=8.0, generate_s=5.0, tool_s=0.0, turns=5, accepted_at=-1.99),
             dict(leased_at=-9.0, total_s=7.5, generate_s=3.0, tool_s=0.0, turns=5, accepted_at=-1.49),
             dict(leased_at=1.0, total_s=4.0, generate_s=2.0, tool_s=0.0, turns=5, accepted_at=5.01)]
  return _measurement(taken=unstalled + [dict(t, server_version=1, policy_version=1) for t in stalled])


def _flat(intervals):
  return [x for interval in intervals for x in interval]


def test_stalls_are_derived_from_the_trajectory_records():
  """The stalled phases' union [−7, −1.5] and [3, 5], less the last turn (0.01 s) before every episode's end: A's
  (−2), B's (−1.5), an unstalled one's (−5) and C's (5)."""
  m = _stall_records()
  assert bench_stalls.stall_threshold_s(m) == pytest.approx(0.25)  # 5 × the median 0.05 s
  assert bench_stalls.first_lease_s(m) == -10.0
  stalls = bench_stalls.derive_stalls(m)
  assert _flat(stalls) == pytest.approx([-7.0, -5.01, -5.0, -2.01, -2.0, -1.51, 3.0, 4.99])
  # On the simulated clock: the warm-up's from the first lease, the window's from where the window starts.
  as_measured = bench_stalls.simulated_stalls(stalls, -10.0)
  assert _flat(as_measured) == pytest.approx([3.0, 4.99, 5.0, 7.99, 8.0, 8.49, 13.0, 14.99])
  assert _flat(bench_stalls.simulated_stalls(stalls, -10.0, 12.0))[-2:] == pytest.approx([15.0, 16.99])
  assert len(bench_stalls.simulated_stalls(stalls, -10.0, math.inf)) == 3  # the warm-up's only
  # A stall going on at the window's start is cut there.
  assert bench_stalls.simulated_stalls([(-1.0, 2.0)], -10.0, 20.0) == ((9.0, 10.0), (20.0, 22.0))
  # The twin gets them, and the per-turn engine time of the unstalled steady-state trajectories (0.01 s); without
  # stalls it is the mean over all of them (C's 2 s included).
  config = validation.bench_config(m)
  assert _flat(config.stalls.intervals) == pytest.approx(_flat(as_measured))
  assert config.episode.gen_s.mean() == pytest.approx(0.01)
  plain = validation.bench_config(m, stalls=False)
  assert not plain.stalls.active
  assert plain.episode.gen_s.mean() == pytest.approx((39 * 0.05 + 2.0) / 40 / 5)
  # A recorded first lease is the origin (bench_pipeline.py records it now); one after a lease is an error.
  m["timeline"] = {"first_lease": -12.0}
  assert bench_stalls.simulated_stalls(bench_stalls.derive_stalls(m), -12.0)[0] == pytest.approx((5.0, 6.99))
  m["timeline"] = {"first_lease": -9.0}
  with pytest.raises(ValueError, match="first_lease"):
    bench_stalls.derive_stalls(m)
  assert bench_stalls.derive_stalls(_measurement()) == []  # no records, no stalls
  # Too few unstalled steady-state records for the per-turn time: the step means are used, which carry the stalls'
  # time, so the twin gets no stall schedule on top.
  m = _stall_records()
  m["taken"] = m["taken"][:10] + m["taken"][40:]
  assert not validation.bench_config(m).stalls.active


def test_simulate_bench_places_the_window_stalls_from_the_simulated_window():
  m = _stall_records()
  report = validation.simulate_bench(m, seed=0)
  assert report.measured_steps == 10 and report.unaccounted() == 0
  warmup_only = simulate(validation.bench_config(m, 0, window_start_s=math.inf))
  assert report.measured_from_s == warmup_only.measured_from_s  # the window's stalls cannot move its start
  start = report.measured_from_s
  assert start != pytest.approx(10.0)  # the simulated warm-up is not the bench's 10 s ...
  aligned = validation.bench_config(m, 0, window_start_s=start)  # ... so C's stall is moved to 3 s after its end
  begin, end = aligned.stalls.intervals[-1]
  assert begin <= start + 3.0 and end == pytest.approx(start + 4.99)  # (merged with the warm-up's, if they meet)
