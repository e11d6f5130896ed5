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
from tests.train import helpers  # pylint: disable=g-bad-import-order

MESH = {"data": 1, "fsdp": 2, "expert": 2, "tensor": 2}


def _moe_config() -> ModelConfig:
  return ModelConfig.tiny("qwen3_moe", vocab_size=helpers.VOCAB, hidden_size=32, num_heads=2, num_kv_heads=2,
                          head_dim=8, num_layers=1, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)


def _has_shard_map(jaxpr) -> bool:
  return any(eqn.primitive.name == "shard_map" or any(_has_shard_map(sub) for sub in
                                                      jax.extend.core.jaxprs_in_params(eqn.params))
             for eqn in jaxpr.eqns)


def test_actor_step_under_the_mesh_equals_the_step_without():
  """The GSPO actor step (no critic to build) of a one-layer MoE on fsdp × expert × tensor = 2 × 2 × 2."""
  config = helpers.learner_config(**{"algorithm": "gspo", "actor.optimizer.eps": 1.0})
  config.mesh.update(MESH)
  mesh = mesh_lib.make_mesh(MESH, jax.devices()[:8])
  model_config = _moe_config()
  learner = Learner(config, model_config, init_params(model_config, jax.random.PRNGKey(0)), mesh=mesh)
  batch, _ = learner.make_batch(helpers.trajectories(seed=4))
  keys = actor_losses.get("gspo").batch_keys
  seq_advantages = np.random.default_rng(0).normal(size=batch["valid"].shape).astype(np.float32)
  selected = steps.select(dict(batch, seq_advantages=seq_advantages), keys, "test")
  actor_batch = learner._device(selected, keys)  # pylint: disable=protected-access
  step = learner._actor_steps["gspo"]  # pylint: disable=protected-access
  assert isinstance(step, steps.MeshJit)
  state0 = learner.actor.state
  results = []
  for program in (step, step.jitted):  # `.jitted`: the same jit, traced without the context mesh
    state = jax.tree.map(lambda x: x.copy(), state0)  # the step donates its state
    traced = program.trace(state, actor_batch, jax.random.PRNGKey(0))
    assert _has_shard_map(traced.jaxpr.jaxpr) == (program is step)
    state, metrics = program(state, actor_batch, jax.random.PRNGKey(0))
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
