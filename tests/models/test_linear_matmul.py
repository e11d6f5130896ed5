"""`sao.models.layers.linear_matmul` (issue 20 item 5): `y = x · Wᵀ` over flattened dims, the same function as one
dot_general over the original dims, and a backward pass whose weight gradient contracts a single token dim (the form
XLA:CPU runs without materialising a transposed copy of the gradient; docs/performance_learner.md "Where the update's
time goes")."""
from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from sao.models.layers import MLP, linear_matmul
from sao.models.config import ModelConfig


def _plain(x, kernel, n_in):
  """The formula: one dot_general contracting x's last n_in dims with the kernel's last n_in."""
  return jax.lax.dot_general(x, kernel, ((tuple(range(x.ndim - n_in, x.ndim)),
                                          tuple(range(kernel.ndim - n_in, kernel.ndim))), ((), ())))


@pytest.mark.parametrize("x_shape, kernel_shape, n_in", [
    ((3, 5, 4), (6, 4), 1),            # MLP / LM-head style: [B, T, E] · [F, E]ᵀ
    ((3, 5, 2, 4), (7, 2, 4), 2),      # o_proj: [B, T, H, D] · [E, H, D]ᵀ
    ((3, 5, 4), (2, 3, 4), 1),         # q_proj: [B, T, E] · [H, D, E]ᵀ → [B, T, H, D]
    ((4,), (6, 4), 1),                 # no leading dims
])
def test_equals_dot_general_and_its_gradients_in_float64(x_shape, kernel_shape, n_in):
  with jax.enable_x64(True):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=x_shape))
    kernel = jnp.asarray(rng.normal(size=kernel_shape))
    cot = jnp.asarray(rng.normal(size=x_shape[:len(x_shape) - n_in] + kernel_shape[:len(kernel_shape) - n_in]))
    y = linear_matmul(x, kernel, n_in)
    assert y.shape == cot.shape and y.dtype == jnp.float64
    np.testing.assert_allclose(y, _plain(x, kernel, n_in), rtol=1e-12, atol=1e-12)
    grads = jax.grad(lambda a, w: jnp.sum(linear_matmul(a, w, n_in) * cot), argnums=(0, 1))(x, kernel)
    want = jax.grad(lambda a, w: jnp.sum(_plain(a, w, n_in) * cot), argnums=(0, 1))(x, kernel)
    for got, expected in zip(grads, want):
      np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def _dot_generals(jaxpr) -> list:
  """Every dot_general equation of a jaxpr, nested jaxprs (jit, custom derivatives) included."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      found.append(eqn)
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          found += _dot_generals(sub.jaxpr)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          found += _dot_generals(sub)
  return found


def test_mlp_backward_contracts_one_token_dim():
  """Every matmul of the MLP's forward and backward on [B, T, E] is 2-D: the weight gradients contract one token dim
  ([B·T]), never (B, T) — the form whose lhs XLA:CPU transposed through a strided copy before."""
  config = ModelConfig.tiny("qwen3")
  x = jnp.ones((2, 3, config.hidden_size), jnp.float32)
  mlp = MLP(config)
  params = mlp.init(jax.random.PRNGKey(0), x)
  jaxpr = jax.make_jaxpr(jax.grad(lambda p, a: jnp.sum(mlp.apply(p, a) ** 2), argnums=(0, 1)))(params, x).jaxpr
  dots = _dot_generals(jaxpr)
  assert len(dots) == 3 * 3  # 3 projections × (forward, input gradient, weight gradient)
  for eqn in dots:
    (lhs_contract, rhs_contract), (lhs_batch, _) = eqn.params["dimension_numbers"]
    assert not lhs_batch and len(lhs_contract) == len(rhs_contract) == 1, eqn
    assert all(v.aval.ndim == 2 for v in eqn.invars), eqn


def test_kernel_not_ending_in_x_dims_raises():
  with pytest.raises(ValueError, match="does not end in x's last 1 dims"):
    linear_matmul(jnp.ones((2, 4)), jnp.ones((3, 5)))
