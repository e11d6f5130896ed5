"""The fleet simulator: determinism, conservation, group waits and staleness on hand-computable cases."""
from __future__ import annotations

import pytest

from sao.simulation.distributions import Distribution
from sao.simulation.fleet import simulate
from sao.simulation.model import EpisodeModel, FleetConfig


def _const(x):
  return Distribution("constant", x)


def _episode(setup=0.0, turns=1, gen=1.0, tool=1.0):
  return EpisodeModel(setup_s=setup if isinstance(setup, Distribution) else _const(setup), turns=_const(turns),
                      gen_s=gen if isinstance(gen, Distribution) else _const(gen),
                      tool_s=tool if isinstance(tool, Distribution) else _const(tool))


def _heavy_tailed(**kwargs):
  base = dict(loops=24, episode=EpisodeModel(setup_s=Distribution("lognormal", 3, 0.5),
                                             turns=Distribution("lognormal", 6, 0.5, 1, 20),
                                             gen_s=Distribution("lognormal", 1, 0.7),
                                             tool_s=Distribution("pareto", 0.5, 1.5, hi=60)),
              step_s=Distribution("lognormal", 10, 0.3), batch_size=8, engine_slots=8, max_outstanding=0,
              buffer_capacity=16, max_staleness=1, lease_ttl_s=300.0, num_tasks=50, max_hours=0.2)
  base.update(kwargs)
  return FleetConfig(**base)


@pytest.mark.parametrize("group_size", [1, 4])
def test_a_seeded_run_is_deterministic(group_size):
  a = simulate(_heavy_tailed(group_size=group_size, seed=3)).summary()
  b = simulate(_heavy_tailed(group_size=group_size, seed=3)).summary()
  c = simulate(_heavy_tailed(group_size=group_size, seed=4)).summary()
  assert a == b
  assert a != c


@pytest.mark.parametrize("group_size,hours", [(1, 0.05), (1, 0.2), (4, 0.05), (4, 0.2)])
def test_every_dispatched_sample_is_accounted_for(group_size, hours):
  """Stopped mid-run (samples running, pushed back, buffered, in the learner): every one is in exactly one place.
  SAO: a small buffer, max_staleness 1 and more loops than the trainer needs exercise every place. Group mode runs
  with max_outstanding = the buffer's capacity and no staleness bound in reach: a rejected sample holds its group
  open until its lease lapses, which stalls a small group fleet (docs/fleet_simulation.md)."""
  group = {} if group_size == 1 else dict(max_outstanding=16, max_staleness=100)
  r = simulate(_heavy_tailed(group_size=group_size, max_hours=hours, **group))
  assert r.unaccounted() == 0
  assert r.dispatched == (r.running + r.awaiting_ack + r.stale_rejected + r.lost + r.accepted)
  assert r.running > 0 and r.trained > 0
  if group_size == 1 and hours == 0.2:
    assert r.awaiting_ack + r.stale_rejected > 0 and r.dropped_stale > 0  # pushed back, went stale


def test_group_waits_for_its_slowest_member_and_sao_does_not():
  """Two loops, batch 2, episodes of 1 s generation + a tool call of 1 s, 5 s, 1 s, 5 s, ... in start order.
  SAO: tasks A (2 s) and B (6 s) start at 0; A ends at 2, C starts and ends at 4: the batch {A, C} is taken at 4,
  trained by 5. GSPO (G = 2): one group of two samples (2 s and 6 s) is complete at 6, trained by 7; the loop freed
  at 2 stays idle (a group needs two)."""
  def run(group_size):
    return simulate(FleetConfig(loops=2, episode=_episode(tool=Distribution("cycle", values=(1.0, 5.0))),
                                step_s=_const(1.0), group_size=group_size, batch_size=2, max_outstanding=0,
                                buffer_capacity=8, target_trajectories=2, num_tasks=10))
  sao, gspo = run(1), run(2)
  assert sao.time_to_target_s == pytest.approx(5.0)
  assert gspo.time_to_target_s == pytest.approx(7.0)
  # SAO, until 5: A 0-2, B 0-5 (of 6), C 2-4, D 4-5. GSPO, until 7: the group's 0-2 and 0-6, then the next group's
  # two samples 6-7; the loop freed at 2 idles for 4 s (one free loop cannot run a group of two).
  assert sao.loop_busy_s == pytest.approx(2 + 5 + 2 + 1)
  assert gspo.loop_busy_s == pytest.approx(2 + 6 + 2 * 1)
  assert gspo.loop_busy_s / (2 * gspo.sim_s) < sao.loop_busy_s / (2 * sao.sim_s) == pytest.approx(1.0)


def test_staleness_is_counted_as_the_trainer_counts_it():
  """One loop, batch 1, max_staleness 0, buffer 1; episodes 2 s, stamped with the engines' version at 1 s; training
  10 s per step. Ep1 (v0) is taken at 2 (staleness 0) and trained until 12 → version 1. Ep2 (v0, done at 4) waits in
  the buffer and is taken at 12 at staleness 1: dropped by the trainer's filter. Ep3 (v0, done at 6) was pushed back
  (buffer full) and re-sent at 12.2: rejected as STALE_POLICY at admission. The freed loop runs ep4 (v1, 12.2-14.2),
  taken fresh at 14.2 and trained until 24.2 → version 2."""
  r = simulate(FleetConfig(loops=1, episode=_episode(), step_s=_const(10.0), batch_size=1, max_staleness=0,
                           max_outstanding=0, buffer_capacity=1, max_steps=3, num_tasks=10))
  assert r.staleness == {0: 2, 1: 1}
  assert (r.trained, r.dropped_stale, r.stale_rejected) == (2, 1, 1)
  assert r.final_version == 2
  assert r.sim_s == pytest.approx(24.2)
  assert r.discarded_s == pytest.approx(4.0)  # two 2-second episodes thrown away
  assert r.unaccounted() == 0


def test_flow_control_caps_the_episodes_in_flight():
  """max_outstanding = 8 with 32 loops: at most 8 samples leased or buffered, so at most 8 loops ever busy."""
  r = simulate(FleetConfig(loops=32, episode=_episode(gen=2.0, tool=3.0), step_s=_const(1.0), batch_size=8,
                           max_outstanding=8, buffer_capacity=16, max_hours=0.05, num_tasks=100))
  assert r.loop_busy_s <= 8 * r.sim_s + 1e-6
  assert r.loop_utilisation == pytest.approx(0.25, abs=0.02)


def test_engine_capacity_slows_turns():
  fast = simulate(FleetConfig(loops=64, episode=_episode(turns=4), step_s=_const(0.1), batch_size=8,
                              max_outstanding=0, engine_slots=0, max_hours=0.05, num_tasks=100))
  slow = simulate(FleetConfig(loops=64, episode=_episode(turns=4), step_s=_const(0.1), batch_size=8,
                              max_outstanding=0, engine_slots=8, max_hours=0.05, num_tasks=100))
  # 64 loops × half of each turn generating = 32 generating on 8 slots: generation 4× slower, turns 2.5× longer.
  assert slow.trained < 0.6 * fast.trained


@pytest.mark.parametrize("kwargs,match", [
    (dict(batch_size=6, group_size=4), "multiple"), (dict(loops=2, group_size=4, batch_size=4), "group_size"),
    (dict(buffer_capacity=4), "buffer_capacity"), (dict(max_outstanding=4), "max_outstanding"),
    (dict(loops=0), "loops")])
def test_bad_configs_name_the_problem(kwargs, match):
  base = dict(loops=8, episode=_episode(), step_s=_const(1.0), batch_size=8, max_hours=1.0)
  with pytest.raises(ValueError, match=match):
    FleetConfig(**{**base, **kwargs})


@pytest.mark.parametrize("fraction,version", [(1.0, 0), (0.3, 1)])
def test_the_version_lands_where_the_step_publishes(fraction, version):
  """The first batch is taken at 2 s and trained for 10 s; stopped at 5.5 s, the new version has landed only if it is
  published 30 % into the step (at 5 s)."""
  r = simulate(FleetConfig(loops=1, episode=_episode(), step_s=_const(10.0), batch_size=1, max_outstanding=0,
                           buffer_capacity=4, publish_fraction=fraction, max_hours=5.5 / 3600, num_tasks=10))
  assert r.sim_s == pytest.approx(5.5)
  assert r.final_version == version


@pytest.mark.parametrize("engine_fraction,staleness", [(None, 0.5), (0.05, 0.0)])
def test_the_engines_may_serve_a_version_before_the_server_counts_it(engine_fraction, staleness):
  """One loop, 2 s episodes whose first turn ends 1 s in, steps of 10 s. Batch 1 (episode 1) is taken at 2 s;
  episode 2 starts then and is stamped at 3 s. With the engines updated 5 % into the step (2.5 s) it carries
  version 1, the version the server takes it at (12 s): staleness 0; with the engines updated with the server (at
  the step's end) it carries version 0: staleness 1. Mean over the two batches: 0 or 0.5."""
  r = simulate(FleetConfig(loops=1, episode=_episode(), step_s=_const(10.0), batch_size=1, max_outstanding=0,
                           buffer_capacity=4, engine_publish_fraction=engine_fraction, max_steps=2, num_tasks=10))
  assert r.steps == 2 and r.staleness_mean == pytest.approx(staleness)
  with pytest.raises(ValueError, match="engine_publish_fraction"):
    FleetConfig(loops=1, episode=_episode(), step_s=_const(1.0), batch_size=1, publish_fraction=0.5,
                engine_publish_fraction=0.6, max_hours=1.0)
