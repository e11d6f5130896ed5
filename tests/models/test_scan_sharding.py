"""`sao.models.scan.shard_residual`: under a context mesh with `tensor` > 1 the layer scan's inputs (the carry, and the
per-layer inputs that remat saves for the backward pass) are sharded E over `tensor` — the compiled program's saved
stack is [N, B / fsdp, T, E / tensor] per device, where without the constraint it was [N, B / fsdp, T, E] — and the
constrained model computes the same log-probs and gradients as the unconstrained one; without a mesh, with `tensor`
of size 1 or not dividing E, it is the identity."""
import re

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from sao.models import scan, transformer
from sao.models.config import ModelConfig
from sao.models.logprobs import token_logprobs
from sao.models.sharding import batch_sharding, param_shardings
from tests.models.helpers import padded_batch, random_params

FSDP, TENSOR = 2, 4
# qwen3_moe with MoE every 2nd layer over 5 layers: period 2 (dense, MoE), 2 periods scanned, one layer after the
# scan; remat full, so each layer's input is the residual the backward pass reads.
CONFIG = ModelConfig.tiny("qwen3_moe", num_layers=5, decoder_sparse_step=2, remat="full", scan_layers=True)
ROWS, LENGTH = 4, 16


def _mesh(**axes):
  return Mesh(np.array(jax.devices()[:8]).reshape(tuple(axes.values())), tuple(axes))


def _sharding_constraints(jaxpr) -> int:
  """Number of sharding_constraint equations in a closed jaxpr, nested ones included."""
  count = 0
  for eqn in jaxpr.eqns:
    count += eqn.primitive.name == "sharding_constraint"
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      count += _sharding_constraints(sub)
  return count


def _step(config):
  def loss(params, ids, mask):
    logp = token_logprobs(params, config, ids, mask)
    return jnp.sum(logp * mask), logp
  return jax.jit(jax.value_and_grad(loss, has_aux=True))


@pytest.mark.parametrize("axes", [None, dict(fsdp=8), dict(fsdp=2, tensor=4)])
def test_identity_without_a_tensor_axis_that_splits_the_hidden(axes):
  """No mesh, `tensor` of size 1, `tensor` not dividing E (the last case: E = 6 on a 4-way axis)."""
  x = jnp.ones((2, 3, 6 if axes and "tensor" in axes else 8))
  if axes is None:
    assert scan.shard_residual(x) is x
    return
  with jax.set_mesh(_mesh(**axes)):
    assert _sharding_constraints(jax.make_jaxpr(scan.shard_residual)(x).jaxpr) == 0


def test_layer_inputs_sharded_over_tensor_and_model_unchanged(monkeypatch):
  mesh = _mesh(fsdp=FSDP, tensor=TENSOR)
  ids, mask = padded_batch(np.random.default_rng(3), CONFIG.vocab_size, [16, 9, 4, 12], LENGTH)
  params = random_params(CONFIG, seed=4)
  data = batch_sharding(mesh)
  args = (jax.device_put(params, param_shardings(CONFIG, mesh)), jax.device_put(ids, data),
          jax.device_put(mask, data))
  hidden = CONFIG.hidden_size
  num_periods = CONFIG.num_layers // scan.layer_period(CONFIG)

  def saved_stacks(compiled_text: str, width: int) -> set[str]:
    # the per-device stacks of layer inputs: [N, B / fsdp, T, width] float32
    return set(re.findall(rf"f32\[{num_periods},{ROWS // FSDP},{LENGTH},{width}\]", compiled_text))

  with jax.set_mesh(mesh):
    compiled = _step(CONFIG).lower(*args).compile()
    (_, logp), grad = compiled(*args)
    constrained = compiled.as_text()
    with monkeypatch.context() as patch:  # the same program without the constraint (the code before it)
      patch.setattr(scan, "shard_residual", lambda x, sequence_parallel=False: x)
      compiled_before = _step(CONFIG).lower(*args).compile()
      (_, want_logp), want_grad = compiled_before(*args)
      unconstrained = compiled_before.as_text()
  assert saved_stacks(unconstrained, hidden), "the unconstrained program no longer saves whole-hidden stacks"
  assert not saved_stacks(constrained, hidden)
  assert saved_stacks(constrained, hidden // TENSOR)

  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(logp)[real], np.asarray(want_logp)[real], rtol=0,
                             atol=1e-4 * float(np.max(np.abs(want_logp))))
  assert jax.tree.structure(grad) == jax.tree.structure(want_grad)
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(grad), jax.tree.leaves(want_grad)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0, atol=1e-4 * (float(jnp.max(jnp.abs(w))) + 1e-6),
                               err_msg=jax.tree_util.keystr(path))
