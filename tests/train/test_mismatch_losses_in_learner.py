"""The registry's TIS and IcePop entries (`actor_loss = "tis" | "icepop"`) train an SAO learner with the config's
hyper-parameters: the step's loss is the float64 reference on the pre-update log-probs and the traced advantages."""
import jax
import numpy as np
import pytest

from sao.train import actor_losses
from tests.core import reference as ref
from tests.train import helpers


def test_default_loss_is_unchanged():
  assert actor_losses.DEFAULT_FOR_ALGORITHM["sao"] == "dis"
  assert helpers.make_learner().actor_loss.name == "dis"


@pytest.mark.parametrize("name,overrides,metric", [
    ("tis", {"sao.tis_cap": 1.05}, "actor/tis_truncated_fraction"),
    ("icepop", {"sao.icepop_ratio_low": 0.9, "sao.icepop_ratio_high": 1.1}, "actor/icepop_masked_fraction")])
def test_loss_trains_with_the_config_hyperparameters(name, overrides, metric):
  learner = helpers.make_learner(**{"actor_loss": name, "sao.critic_warmup_steps": 0, **overrides})
  batch, _ = learner.make_batch(helpers.trajectories(seed=4))
  logprobs, _ = learner.policy_logprobs(batch)
  before = jax.device_get(learner.actor_params)
  metrics, traces = learner.update_traced(batch, list(range(batch["input_ids"].shape[0])))
  assert learner.version == 1 and not helpers.tree_equal(jax.device_get(learner.actor_params), before)
  assert "actor/dis_masked_fraction" not in metrics
  mask = np.asarray(batch["action_mask"], bool)
  args = (np.asarray(logprobs), batch["rollout_logprobs"], traces["advantages"], mask)
  if name == "tis":
    want_loss, want_fraction = ref.tis_loss(*args, overrides["sao.tis_cap"])
  else:
    want_loss, want_fraction = ref.icepop_loss(*args, overrides["sao.icepop_ratio_low"],
                                               overrides["sao.icepop_ratio_high"])
  np.testing.assert_allclose(metrics["actor/loss"], want_loss, rtol=1e-4, atol=1e-5)
  assert 0.0 < want_fraction < 1.0  # the synthetic rollout log-probs put tokens on both sides of the bound
  np.testing.assert_allclose(metrics[metric], want_fraction, atol=1.5 / mask.sum())
