"""launch/sweeps/toy_offpolicy.py: each arm changes exactly its option (and the stress arms the stress keys too)
from its reference, every override is a real config key, 3 seeds per arm."""
from launch import sweep as s
from tests.launch.test_sweep_issue21 import _flat

STRESS_KEYS = {"server.max_outstanding": 256, "learner.actor.optimizer.learning_rate": 1.2e-3}
OPTION_KEYS = {
    "tis": {"learner.actor_loss": "tis"},
    "icepop": {"learner.actor_loss": "icepop"},
    "vtrace": {"learner.sao.critic_target_correction": "vtrace"},
    "ev_gate": {"learner.sao.actor_start": "critic_ev"},
    "adaptive_staleness": {"server.adaptive_staleness.enabled": True},
}



def test_each_arm_changes_exactly_its_option():
  runs = s.load_sweep(s.sweep_path("toy_offpolicy"))
  arms = {r.arm for r in runs}
  expected = {"stabilized", "stress", *OPTION_KEYS, *(f"stress_{a}" for a in OPTION_KEYS)}
  assert arms == expected and len(runs) == 3 * len(expected)
  assert all(sorted(r.overrides["seed"] for r in runs if r.arm == arm) == [0, 1, 2] for arm in arms)
  reference = _flat(s.run_config_of(next(r for r in runs if r.arm == "stabilized" and r.overrides["seed"] == 0)))
  for r in runs:
    s.validate_run(r)
    if r.overrides["seed"] != 0 or r.arm == "stabilized":
      continue
    changed = {k: v for k, v in _flat(s.run_config_of(r)).items() if v != reference[k]}
    option = OPTION_KEYS.get(r.arm.removeprefix("stress_"), {})
    assert changed == {**(STRESS_KEYS if r.arm.startswith("stress") else {}), **option}, r.arm
