"""The learner's programs trace under `jax.set_mesh` (`steps.MeshJit`): the routed MoE then lays its tokens out by
mesh axis (a shard_map over the batch axes), and the step equals the same jitted step traced without the mesh."""
import jax
import jax.extend
import numpy as np

from sao.models.config import ModelConfig
from sao.models.transformer import init_params
from sao.train import actor_losses, steps
from sao.train import mesh as mesh_lib
from sao.train.learner import Learner
from tests.train import helpers

MESH = {"data": 1, "fsdp": 2, "expert": 2, "tensor": 2}


def _moe_config() -> ModelConfig:
  return ModelConfig.tiny("qwen3_moe", vocab_size=helpers.VOCAB, num_experts=4, num_experts_per_tok=2)


def _has_shard_map(jaxpr) -> bool:
  return any(eqn.primitive.name == "shard_map" or any(_has_shard_map(sub) for sub in
                                                      jax.extend.core.jaxprs_in_params(eqn.params))
             for eqn in jaxpr.eqns)


def test_actor_step_under_the_mesh_equals_the_step_without():
  config = helpers.learner_config(**{"actor.optimizer.eps": 1.0})
  config.mesh.update(MESH)
  mesh = mesh_lib.make_mesh(MESH, jax.devices()[:8])
  model_config = _moe_config()
  params = init_params(model_config, jax.random.PRNGKey(0))
  results = []
  for under_mesh in (True, False):
    learner = Learner(config, model_config, params, mesh=mesh)
    batch, _ = learner.make_batch(helpers.trajectories(seed=4))
    rng = np.random.default_rng(0)
    advantages = np.where(batch["action_mask"], rng.normal(size=batch["action_mask"].shape), 0.0)
    actor_batch = learner._device(steps.select(dict(batch, advantages=advantages.astype(np.float32)),  # pylint: disable=protected-access
                                               actor_losses.get("dis").batch_keys, "test"),
                                  actor_losses.get("dis").batch_keys)
    step = learner._actor_steps["dis"]  # pylint: disable=protected-access
    assert isinstance(step, steps.MeshJit)
    program = step if under_mesh else step.jitted  # `.jitted`: the same jit, traced without the context mesh
    assert _has_shard_map(program.trace(learner.actor.state, actor_batch, jax.random.PRNGKey(0)).jaxpr.jaxpr) \
        == under_mesh
    state, metrics = program(learner.actor.state, actor_batch, jax.random.PRNGKey(0))
    results.append((jax.device_get(metrics), jax.device_get(state)))
  (m_mesh, s_mesh), (m_plain, s_plain) = results
  assert m_mesh["skipped"] == 0
  # Sums in another order (per-shard sorts, psums): float32 rounding of O(1)–O(10) means.
  for key in ("loss", "grad_norm", "entropy"):
    np.testing.assert_allclose(m_mesh[key], m_plain[key], rtol=1e-5, atol=1e-5, err_msg=key)
  for x, y in zip(jax.tree.leaves(s_plain.opt_state), jax.tree.leaves(s_mesh.opt_state)):  # Adam's (1 − b1)·g
    np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-5 * max(1e-30, float(np.max(np.abs(x)))))
  for x, y in zip(jax.tree.leaves(s_plain.params), jax.tree.leaves(s_mesh.params)):
    np.testing.assert_allclose(y, x, rtol=0, atol=1e-7)
