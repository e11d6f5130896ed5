"""`sao.train.actor_start`: the actor's start gated on the critic's explained variance over a window, with a cap; the
"steps" mode is today's `critic_warmup_steps` rule exactly."""
import math

import ml_collections
import pytest

from sao.train import actor_start
from sao.train import config as config_lib


def _gate(**overrides):
  c = config_lib.default_learner_config().sao
  c = ml_collections.ConfigDict(c.to_dict())
  c.update(overrides)
  return actor_start.ActorStart(c)


def _ev(x):
  return {actor_start.EV_METRIC: x}


def test_steps_mode_is_the_warmup_count():
  gate = _gate(critic_warmup_steps=3)
  assert [gate.decide(u) for u in range(6)] == [False, False, False, True, True, True]
  gate.observe(_ev(0.9))  # ignored
  assert gate.recent == [] and gate.metrics() == {} and gate.plan(2) == {"actor_step": False}


def test_opens_on_the_first_full_window_whose_mean_reaches_the_threshold_and_latches():
  gate = _gate(actor_start="critic_ev", actor_start_ev_threshold=0.5, actor_start_ev_window=3,
               actor_start_max_steps=100, critic_warmup_steps=0)
  decisions = []
  for u, ev in enumerate([0.9, 0.9, 0.0, 0.6, 0.8, 0.2, -5.0]):
    decisions.append(gate.decide(u))
    gate.observe(_ev(ev))
  # Update 0-2: fewer than 3 EVs (critic_warmup_steps = 0 does not open it). Update 3 sees [0.9, 0.9, 0.0]: mean
  # 0.6 ≥ 0.5, opens; later low EVs do not shut it.
  assert decisions == [False, False, False, True, True, True, True]
  assert gate.started_at == 3 and gate.reason == "ev"
  assert gate.metrics()["actor/started_at"] == 3.0


def test_a_window_just_below_the_threshold_stays_shut():
  gate = _gate(actor_start="critic_ev", actor_start_ev_threshold=0.5, actor_start_ev_window=2,
               actor_start_max_steps=100)
  for u, ev in enumerate([0.49, 0.5, 0.49, 0.5]):  # every pair averages 0.495
    assert not gate.decide(u)
    gate.observe(_ev(ev))
  assert gate.window_mean() == pytest.approx(0.495)
  assert gate.decide(4) is False
  gate.observe(_ev(0.52))
  assert gate.decide(5) is True  # [0.5, 0.52]


def test_the_cap_opens_it_whatever_the_critic():
  gate = _gate(actor_start="critic_ev", actor_start_ev_threshold=1.0, actor_start_ev_window=2,
               actor_start_max_steps=4)
  decisions = []
  for u in range(6):
    decisions.append(gate.decide(u))
    gate.observe(_ev(0.1))
  assert decisions == [False, False, False, False, True, True]
  assert gate.started_at == 4 and gate.reason == "cap"
  assert _gate(actor_start="critic_ev", actor_start_max_steps=0).decide(0)  # cap 0: from the first update


def test_a_non_finite_or_missing_ev_counts_as_zero():
  gate = _gate(actor_start="critic_ev", actor_start_ev_threshold=0.3, actor_start_ev_window=2)
  gate.observe(_ev(float("nan")))
  gate.observe({})
  assert gate.recent == [0.0, 0.0]
  assert math.isnan(_gate(actor_start="critic_ev").metrics()["actor/start_ev_window_mean"])


def test_an_ev_below_minus_one_counts_as_minus_one():
  """A batch whose targets barely vary gives EVs like −50: stored as −1, two good updates then open a window of 3
  at threshold 0.3 (the raw −50 would hold the mean below it for the whole window)."""
  gate = _gate(actor_start="critic_ev", actor_start_ev_threshold=0.3, actor_start_ev_window=3,
               actor_start_max_steps=100)
  for ev in (-50.0, 0.96, 0.96):
    gate.observe(_ev(ev))
  assert gate.recent == [-1.0, 0.96, 0.96]
  assert gate.window_mean() == pytest.approx(0.92 / 3) and gate.decide(3)


def test_state_round_trips_and_the_plan_carries_the_window():
  gate = _gate(actor_start="critic_ev", actor_start_ev_threshold=0.2, actor_start_ev_window=2)
  for ev in (0.1, 0.4):
    gate.observe(_ev(ev))
  plan = gate.plan(2)
  assert plan == {"actor_step": True, "actor_start": {"recent_ev": [0.1, 0.4], "started_at": 2}}
  restored = _gate(actor_start="critic_ev", actor_start_ev_threshold=0.2, actor_start_ev_window=2)
  restored.load_state_dict(gate.state_dict())
  assert restored.state_dict() == gate.state_dict() and restored.decide(3)
  fresh = _gate(actor_start="critic_ev")
  fresh.load_state_dict(None)  # a checkpoint from before the gate
  assert fresh.state_dict() == {"recent": [], "started_at": None, "reason": ""}


def test_config_validation_names_the_key():
  c = config_lib.default_learner_config()
  assert c.sao.actor_start == "steps"
  for key, value in (("actor_start", "ev"), ("actor_start_ev_window", 0), ("actor_start_ev_threshold", 1.5),
                     ("actor_start_max_steps", -1)):
    bad = config_lib.default_learner_config()
    bad.sao[key] = value
    with pytest.raises(ValueError, match=f"sao.{key}"):
      config_lib.validate_learner_config(bad)


def test_phases_keep_the_warm_starts_off_the_gate_and_the_rl_loss():
  """Value pretraining never steps the actor whatever `sao.actor_start` says, and the supervised warm start (GRPO-
  shaped) does not inherit an RL actor loss that reads SAO's token advantages."""
  from sao.train import phases  # pylint: disable=g-import-not-at-top
  from tests.train import helpers  # pylint: disable=g-import-not-at-top
  learner = helpers.learner_config(**{"actor_loss": "tis", "sao.actor_start": "critic_ev"})
  config = ml_collections.ConfigDict(dict(learner=learner, recipe=dict(sft_learning_rate=3e-3, sft_steps=8,
                                                                        value_pretrain_steps=5)))
  pretrain = phases.value_pretrain_config(config)
  assert pretrain.sao.actor_start == "steps" and pretrain.sao.critic_warmup_steps == 6
  assert phases.sft_config(config).actor_loss == ""
  assert phases.rl_config(config).actor_loss == "tis" and phases.rl_config(config).sao.actor_start == "critic_ev"
  config_lib.validate_learner_config(phases.sft_config(config))
