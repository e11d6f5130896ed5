"""The actor-loss registry: a new loss is one `register` call, selected by `learner.actor_loss`."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao.train import actor_losses, steps
from tests.train import helpers

_NAME = "test_truncated_is"


@pytest.fixture
def truncated_is():
  """Registers a truncated-importance-sampling REINFORCE loss, `−Σ m·min(r, cap)·A·logp`, whose cap is read from
  the config (`sao.dis_ratio_high`); unregisters it afterwards."""

  @actor_losses.register(_NAME, batch_keys=(*actor_losses.BASE_KEYS, "rollout_logprobs", "advantages"),
                         hparams=lambda config: {"cap": config.sao.dis_ratio_high})
  def loss(logprobs, batch, *, cap):
    mask = batch["action_mask"].astype(bool)
    ratio = jnp.exp(jax.lax.stop_gradient(logprobs) - batch["rollout_logprobs"])
    weight = jnp.minimum(ratio, cap)
    loss_sum = -jnp.sum(jnp.where(mask, weight * batch["advantages"] * logprobs, 0.0))
    truncated = jnp.sum(mask & (ratio > cap), dtype=jnp.float32)
    return loss_sum, {"truncated_fraction": actor_losses.Mean(total=truncated, count=jnp.sum(mask, dtype=jnp.float32))}

  yield loss
  actor_losses.unregister(_NAME)


def test_registered_loss_trains_with_its_config_hyperparameters(truncated_is):
  cap = 1.05  # the trainer's and the synthetic rollout log-probs differ by up to ~1: some ratios exceed the cap
  learner = helpers.make_learner(**{"actor_loss": _NAME, "sao.critic_warmup_steps": 0, "sao.dis_ratio_high": cap})
  batch, _ = learner.make_batch(helpers.trajectories(seed=4))
  logprobs, _ = learner.policy_logprobs(batch)
  actor_before = jax.device_get(learner.actor_params)
  rows = list(range(batch["input_ids"].shape[0]))
  metrics, traces = learner.update_traced(batch, rows)
  assert not helpers.tree_equal(jax.device_get(learner.actor_params), actor_before) and learner.version == 1
  assert "actor/dis_masked_fraction" not in metrics  # DIS did not run
  # The step's loss is the registered function on the pre-update log-probs with the config's cap.
  mask = batch["action_mask"]
  ratio = np.exp(np.asarray(logprobs) - batch["rollout_logprobs"])
  expected = -np.sum(np.where(mask, np.minimum(ratio, cap) * traces["advantages"] * np.asarray(logprobs), 0.0))
  np.testing.assert_allclose(metrics["actor/loss"], expected / mask.sum(), rtol=1e-5, atol=1e-5)
  truncated = np.sum(mask & (ratio > cap)) / mask.sum()
  assert 0.0 < truncated < 1.0
  np.testing.assert_allclose(metrics["actor/truncated_fraction"], truncated, atol=1.5 / mask.sum())
  assert np.isfinite(metrics["actor/logprob_mismatch"])  # the step's own metrics for losses reading rollout log-probs


def test_registry_errors_name_the_problem(truncated_is):
  with pytest.raises(ValueError, match="already registered"):
    actor_losses.register(_NAME, batch_keys=actor_losses.BASE_KEYS)(truncated_is)
  with pytest.raises(ValueError, match="batch_keys must include"):
    actor_losses.register("no_mask", batch_keys=("input_ids", "attention_mask"))
  with pytest.raises(ValueError, match="actor_loss"):
    helpers.make_learner(**{"actor_loss": "no_such_loss"})
  # A loss reading group advantages cannot run under SAO, which hands the actor token advantages.
  with pytest.raises(ValueError, match="seq_advantages"):
    helpers.make_learner(**{"actor_loss": "gspo"})
  assert set(actor_losses.names()) >= {"dis", "gspo", "ppo_clip", "sft", _NAME}


def test_a_loss_metric_may_not_shadow_the_steps_own():
  @actor_losses.register("test_shadowing", batch_keys=actor_losses.BASE_KEYS)
  def shadowing(logprobs, batch):
    tokens = jnp.sum(batch["action_mask"], dtype=jnp.float32)
    return -jnp.sum(jnp.where(batch["action_mask"], logprobs, 0.0)), {"loss": actor_losses.Mean(tokens, tokens)}

  try:
    learner = helpers.make_learner(**{"algorithm": "grpo"})
    batch, _ = learner.make_batch(helpers.trajectories(seed=0))
    actor_step = steps.make_actor_step("test_shadowing", helpers.model_config(), learner.actor.tx,
                                       learner.actor.trainable, learner.actor.shardings, learner.mesh)
    with pytest.raises(ValueError, match="step's own"):
      actor_step(learner.actor.state, {k: batch[k] for k in actor_losses.BASE_KEYS}, jax.random.PRNGKey(0))
  finally:
    actor_losses.unregister("test_shadowing")
