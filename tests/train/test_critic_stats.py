"""critic_stats: the pre-update diagnostics from merged per-micro-batch sums equal float64 references on the whole
masked batch, whatever the split (a zero carry first, an all-masked part anywhere)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao.core import metrics as metrics_lib
from sao.train import critic_stats


def _merged(values, returns, mask, parts):
  """Zero carry (`steps.zero_carry`) merged with each row block's metrics, as a step's scan does."""
  blocks = np.array_split(np.arange(values.shape[0]), parts)
  shapes = jax.eval_shape(critic_stats.step_metrics, values[:1], returns[:1], mask[:1])
  carry = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  for rows in blocks:
    m = critic_stats.step_metrics(values[rows], returns[rows], mask[rows])
    carry = jax.tree.map(lambda a, b: a.merge(b), carry, m, is_leaf=lambda x: hasattr(x, "merge"))
  return {k: v.compute() for k, v in carry.items()}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_diagnostics_match_float64_reference(seed):
  rng = np.random.default_rng(seed)
  values = rng.normal(0.3, 0.8, (9, 13)).astype(np.float32)
  returns = rng.normal(0.5, 1.1, (9, 13)).astype(np.float32)
  mask = rng.random((9, 13)) < 0.4
  mask[2] = False  # an all-masked row block somewhere
  computed = _merged(values, returns, mask, parts=4)
  assert set(computed) == {f"{critic_stats.PREFIX}{k}" for k in ("mean", "var", "min", "max", "residual_var")}
  returns_var = np.var(returns[mask].astype(np.float64))
  diag = critic_stats.diagnostics({"actor/loss": 0.5, critic_stats.RETURNS_VAR: float(returns_var),
                                   **{f"critic/{k}": float(v) for k, v in computed.items()}})
  assert diag.pop("actor/loss") == 0.5  # the others pass through
  v, r = values[mask].astype(np.float64), returns[mask].astype(np.float64)
  expected = {"critic/explained_variance": 1 - np.var(r - v) / np.var(r), "critic/values/mean": v.mean(),
              "critic/values/std": v.std(), "critic/values/min": v.min(), "critic/values/max": v.max()}
  assert set(diag) == set(expected)
  for key, want in expected.items():
    np.testing.assert_allclose(float(diag[key]), want, rtol=1e-5, atol=1e-6, err_msg=key)
  # The library's two-pass explained variance on the same arrays.
  ev = metrics_lib.explained_variance(jnp.asarray(values), jnp.asarray(returns), jnp.asarray(mask))
  np.testing.assert_allclose(float(diag["critic/explained_variance"]), float(ev), rtol=1e-5, atol=1e-6)


def test_nothing_counted_reads_zero():
  values = jnp.ones((4, 5)) * 3.0
  computed = _merged(values, values, jnp.zeros((4, 5), bool), parts=2)
  diag = critic_stats.diagnostics({critic_stats.RETURNS_VAR: 0.0,
                                   **{f"critic/{k}": float(v) for k, v in computed.items()}})
  assert diag == dict.fromkeys(("critic/explained_variance", "critic/values/mean", "critic/values/std",
                                "critic/values/min", "critic/values/max"), 0.0), diag
  assert critic_stats.diagnostics({"critic/loss": 1.0}) == {"critic/loss": 1.0}  # nothing to turn


def test_split_separates_the_prefixed_metrics():
  reported, first = critic_stats.split({"loss": 1.0, "v0_mean": 2.0, "value_mean": 3.0})
  assert reported == {"loss": 1.0, "value_mean": 3.0} and first == {"v0_mean": 2.0}
