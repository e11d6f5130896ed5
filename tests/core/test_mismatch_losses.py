"""TIS and IcePop (`sao.core.losses`) against float64 loop references, in float64, with their exact gradients."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao.core import losses
from tests.core import reference as ref
from tests.core.test_losses import policy_inputs


def _float64(*arrays):
  return [jnp.asarray(a, jnp.float64) if np.asarray(a).dtype.kind == "f" else a for a in arrays]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("cap", [2.0, 1.2])
def test_tis_matches_reference_in_float64(seed, cap):
  logp, rollout, advantages, mask, _ = policy_inputs(seed)
  want_loss, want_truncated = ref.tis_loss(logp, rollout, advantages, mask, cap)
  with jax.enable_x64(True):
    loss, aux = jax.jit(losses.tis_policy_loss, static_argnums=(4,))(*_float64(logp, rollout, advantages), mask, cap)
    assert loss.dtype == jnp.float64
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(float(aux["truncated_fraction"]), want_truncated, rtol=1e-12)
  assert 0.0 < want_truncated < 1.0  # the inputs exercise both truncated and untouched tokens


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("band", [(0.5, 5.0), (0.2, 1.5)])
def test_icepop_matches_reference_in_float64(seed, band):
  logp, rollout, advantages, mask, _ = policy_inputs(seed)
  want_loss, want_masked = ref.icepop_loss(logp, rollout, advantages, mask, *band)
  with jax.enable_x64(True):
    loss, aux = jax.jit(losses.icepop_policy_loss, static_argnums=(4, 5))(*_float64(logp, rollout, advantages), mask,
                                                                          *band)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(float(aux["masked_fraction"]), want_masked, rtol=1e-12)
  assert 0.0 < want_masked < 1.0


def test_gradients_are_the_truncated_and_masked_weights():
  """∂L/∂logp_t = −w_t·A_t/N with w = min(k, C) (TIS) or k·1[α ≤ k ≤ β] (IcePop); 0 off the action tokens."""
  logp, rollout, advantages, mask, _ = policy_inputs(3)
  n = mask.sum()
  with jax.enable_x64(True):
    lp, ro, adv = _float64(logp, rollout, advantages)
    k = np.exp(np.asarray(lp) - np.asarray(ro))
    tis_grad = np.asarray(jax.grad(lambda x: losses.tis_policy_loss(x, ro, adv, mask, 2.0)[0])(lp))
    np.testing.assert_allclose(tis_grad, np.where(mask, -np.minimum(k, 2.0) * advantages / n, 0.0), rtol=1e-12,
                               atol=1e-15)
    ice_grad = np.asarray(jax.grad(lambda x: losses.icepop_policy_loss(x, ro, adv, mask, 0.5, 5.0)[0])(lp))
    kept = mask & (k >= 0.5) & (k <= 5.0)
    np.testing.assert_allclose(ice_grad, np.where(kept, -k * advantages / n, 0.0), rtol=1e-12, atol=1e-15)
    assert np.all(ice_grad[mask & ~kept] == 0.0) and np.any(mask & ~kept)


def test_on_policy_both_reduce_to_reinforce():
  logp, _, advantages, mask, _ = policy_inputs(4)
  reinforce = -np.sum(np.where(mask, advantages * logp.astype(np.float64), 0.0)) / mask.sum()
  tis, tis_aux = losses.tis_policy_loss(logp, logp, advantages, mask)
  ice, ice_aux = losses.icepop_policy_loss(logp, logp, advantages, mask)
  np.testing.assert_allclose([tis, ice], reinforce, rtol=1e-5)
  assert float(tis_aux["truncated_fraction"]) == 0.0 and float(ice_aux["masked_fraction"]) == 0.0


def test_bad_arguments_name_the_problem():
  logp, rollout, advantages, mask, _ = policy_inputs(0)
  with pytest.raises(ValueError, match="cap"):
    losses.tis_policy_loss(logp, rollout, advantages, mask, 0.0)
  with pytest.raises(ValueError, match="ratio_low"):
    losses.icepop_policy_loss(logp, rollout, advantages, mask, 1.0, 5.0)
  with pytest.raises(ValueError, match="rollout_logprobs"):
    losses.tis_policy_loss(logp, rollout[:, :-1], advantages, mask)
