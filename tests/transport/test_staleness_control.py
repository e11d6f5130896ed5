"""`sao.transport.staleness_control`: the AIMD bound on `max_outstanding` that follows the learner's log-prob
mismatch, and the server honouring it."""
import math

import pytest

from sao.transport import staleness_control as sc


def _controller(base=128, batch_size=32, group_size=1, **knobs):
  return sc.StalenessController(sc.AdaptiveStalenessConfig(enabled=True, **knobs), base, batch_size, group_size)


def test_shrinks_on_high_mismatch_down_to_one_batch_and_grows_back_when_calm():
  ctl = _controller(high=0.03, low=0.01, shrink=0.5, calm_updates=2)
  trace = [ctl.observe(s) for s in (0.005, 0.05, 0.2, 0.1, 0.02, 0.005, 0.005, 0.005, 0.005, 0.005, 0.005, 0.005,
                                    0.005)]
  # 128 → 64 → 32 (the floor: one batch) → 32; in band holds; then +32 after every 2 calm updates, up to 128.
  assert trace == [128, 64, 32, 32, 32, 32, 64, 64, 96, 96, 128, 128, 128]
  assert (ctl.shrinks, ctl.grows) == (2, 3)
  assert ctl.withheld == sum(128 - m for m in trace)


def test_a_mismatch_in_the_band_or_missing_resets_nothing_but_the_calm_streak():
  ctl = _controller(high=0.03, low=0.01, calm_updates=2)
  ctl.observe(0.5)
  assert ctl.allowance == 64
  ctl.observe(0.001)
  ctl.observe(0.02)  # in the band: the calm streak restarts
  ctl.observe(0.001)
  assert ctl.allowance == 64
  ctl.observe(None)  # a critic-only update: no measurement, nothing changes
  ctl.observe(float("nan"))
  assert ctl.allowance == 64 and ctl.calm == 1
  ctl.observe(0.001)
  assert ctl.allowance == 96


def test_allowances_are_whole_groups_and_respect_min_outstanding():
  ctl = _controller(base=100, batch_size=24, group_size=8, shrink=0.3, min_outstanding=40, grow=10)
  assert ctl.base == 96 and ctl.floor == 40 and ctl.grow == 16
  assert ctl.observe(1.0) == 40  # ⌊0.3·96⌋ = 28 → 24, below the floor
  assert all(m % 8 == 0 for m in (ctl.base, ctl.floor, ctl.grow, ctl.allowance))


def test_step_reports_the_throughput_cost():
  ctl = _controller()
  out = ctl.step({"actor/logprob_mismatch": 0.5}, {"lease_throttled": 7})
  assert out == {"staleness_control/max_outstanding": 64.0, "staleness_control/allowance_fraction": 0.5,
                 "staleness_control/withheld_sample_updates": 64.0, "staleness_control/shrinks": 1.0,
                 "staleness_control/grows": 0.0, "staleness_control/lease_calls_throttled": 7.0}
  assert ctl.step({})["staleness_control/withheld_sample_updates"] == 128.0  # no signal: held, still withheld
  other = _controller(signal="actor/mismatch_kl_k3")
  other.step({"actor/logprob_mismatch": 0.5, "actor/mismatch_kl_k3": 0.001})
  assert other.allowance == 128


def test_off_by_default_and_bad_settings_name_the_problem():
  assert sc.from_run_config(None, 64, 32, 1) is None
  assert sc.from_run_config({"enabled": False}, 64, 32, 1) is None
  assert isinstance(sc.from_run_config({"enabled": True}, 64, 32, 1), sc.StalenessController)
  with pytest.raises(ValueError, match="max_outstanding"):
    sc.from_run_config({"enabled": True}, 0, 32, 1)
  for knobs, match in (({"low": 0.05, "high": 0.03}, "low < high"), ({"shrink": 1.0}, "shrink"),
                       ({"calm_updates": 0}, "calm_updates"), ({"grow": -1}, "grow")):
    with pytest.raises(ValueError, match=match):
      sc.AdaptiveStalenessConfig(**knobs)
  with pytest.raises(TypeError):
    sc.from_run_config({"enabled": True, "hihg": 0.1}, 64, 32, 1)  # a misspelt knob is not ignored
  assert math.isclose(sc.AdaptiveStalenessConfig().high, 0.03)


def test_the_server_leases_under_the_moved_bound_and_counts_refusals(tmp_path):
  from sao.transport.client import TrajectoryClient  # pylint: disable=g-import-not-at-top
  from tests.transport.helpers import make_traj, running  # pylint: disable=g-import-not-at-top
  with running(tmp_path, max_outstanding=4) as server, TrajectoryClient(f"127.0.0.1:{server.port}") as client:
    server.set_max_outstanding(2)
    tasks = list(client.lease(10).tasks)
    assert len(tasks) == 2  # the moved bound, not the configured 4
    assert not client.lease(1).tasks
    assert server.stats()["lease_throttled"] == 1 and server.stats()["max_outstanding"] == 2
    assert all(o.accepted for o in client.submit([make_traj(t) for t in tasks]))
    assert len(server.take_batch(2, timeout_s=5)) == 2
    server.set_max_outstanding(4)  # grown back
    assert len(client.lease(10).tasks) == 4
    with pytest.raises(ValueError, match="samples > 0"):
      server.set_max_outstanding(0)
