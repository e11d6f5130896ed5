"""launch/sweeps/toy_offpolicy.py (number search) and toy_chain_offpolicy.py (search_chain): each arm changes exactly
its option (and the stress arms the stress keys too) from its reference, every override is a real config key, 3 seeds
per arm; the chain sweep's reference runs are toy_critic_matters' SAO runs."""
import pytest

from launch import sweep as s
from tests.launch.test_sweep_issue21 import _flat

# sweep -> (reference arm, stress overrides: 4 batches outstanding instead of 2, 3× the actor's learning rate)
SWEEPS = {
    "toy_offpolicy": ("stabilized", {"server.max_outstanding": 256, "learner.actor.optimizer.learning_rate": 1.2e-3}),
    "toy_chain_offpolicy": ("sao", {"server.max_outstanding": 128, "learner.actor.optimizer.learning_rate": 6e-4}),
}
OPTION_KEYS = {
    "tis": {"learner.actor_loss": "tis"},
    "icepop": {"learner.actor_loss": "icepop"},
    "vtrace": {"learner.sao.critic_target_correction": "vtrace"},
    "ev_gate": {"learner.sao.actor_start": "critic_ev"},
    "adaptive_staleness": {"server.adaptive_staleness.enabled": True},
}



@pytest.mark.parametrize("sweep", sorted(SWEEPS))
def test_each_arm_changes_exactly_its_option(sweep):
  reference_arm, stress_keys = SWEEPS[sweep]
  runs = s.load_sweep(s.sweep_path(sweep))
  arms = {r.arm for r in runs}
  expected = {reference_arm, "stress", *OPTION_KEYS, *(f"stress_{a}" for a in OPTION_KEYS)}
  assert arms == expected and len(runs) == 3 * len(expected)
  assert all(sorted(r.overrides["seed"] for r in runs if r.arm == arm) == [0, 1, 2] for arm in arms)
  reference = _flat(s.run_config_of(next(r for r in runs if r.arm == reference_arm and r.overrides["seed"] == 0)))
  base = reference
  for r in runs:
    s.validate_run(r)
    if r.overrides["seed"] != 0 or r.arm == reference_arm:
      continue
    changed = {k: v for k, v in _flat(s.run_config_of(r)).items() if v != reference[k]}
    option = OPTION_KEYS.get(r.arm.removeprefix("stress_"), {})
    assert changed == {**(stress_keys if r.arm.startswith("stress") else {}), **option}, r.arm
  # The stress keys' reference values: twice the default 2 batches outstanding, 3× the recipe's actor LR.
  assert stress_keys["server.max_outstanding"] == 4 * base["rollout.batch_size"] == 2 * base["server.max_outstanding"]
  assert stress_keys["learner.actor.optimizer.learning_rate"] == pytest.approx(
      3 * base["learner.actor.optimizer.learning_rate"])


def test_the_chain_sweeps_reference_is_toy_critic_matters_sao():
  """Same names, config and overrides (seeds 0–2 of toy_critic_matters' five): one workdir for both sweeps trains
  these three runs once."""
  chain = [r for r in s.load_sweep(s.sweep_path("toy_chain_offpolicy")) if r.arm == "sao"]
  matters = [r for r in s.load_sweep(s.sweep_path("toy_critic_matters")) if r.arm == "sao" and r.overrides["seed"] < 3]
  assert len(chain) == 3 and [(r.name, r.config, r.overrides) for r in chain] == [
      (r.name, r.config, r.overrides) for r in matters]
