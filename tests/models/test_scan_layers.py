"""`ModelConfig.scan_layers`: the scanned forward pass is the unrolled one (logits, values and every parameter's
gradient), over the same per-layer parameter tree, with and without remat, for dense, MoE and hybrid layer patterns
including depths that leave layers outside the last whole period."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao.models import scan, transformer
from sao.models.config import ModelConfig

_LINEAR, _FULL = "linear_attention", "full_attention"
# (model type, overrides, expected period): 3 dense layers (period 1); MoE every 2nd layer over 5 layers (period 2,
# one layer after the scan); hybrid [L, F] × 2 + [L] (period 2, one layer after the scan).
CASES = {
    "qwen3": ("qwen3", dict(num_layers=3), 1),
    "qwen3_moe": ("qwen3_moe", dict(num_layers=5, decoder_sparse_step=2), 2),
    "qwen3_5_moe_text": ("qwen3_5_moe_text", dict(num_layers=5, layer_types=(_LINEAR, _FULL) * 2 + (_LINEAR,)), 2),
}


def _config(name: str, **overrides) -> ModelConfig:
  model_type, case_overrides, _ = CASES[name]
  return ModelConfig.tiny(model_type, **{**case_overrides, **overrides})


def _batch():
  """Rows as the learner pads them: left padding (row 0), right padding (row 1), none (row 2)."""
  ids = jax.random.randint(jax.random.PRNGKey(1), (3, 12), 0, 128)
  mask = np.ones((3, 12), np.int32)
  mask[0, :4] = 0
  mask[1, 9:] = 0
  return ids, jnp.asarray(mask)


def _loss_and_grads(config: ModelConfig, params: dict, ids, mask):
  weights = jax.random.normal(jax.random.PRNGKey(2), (*ids.shape, config.vocab_size))

  def loss(p):
    logits, _ = transformer.CausalLM(config).apply({"params": p}, ids, mask)
    return jnp.sum(logits * weights * mask[..., None]) / ids.size, logits

  (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return logits, grads


def test_layer_period():
  for name, (_, _, period) in CASES.items():
    assert scan.layer_period(_config(name)) == period, name
  hybrid = ModelConfig.tiny("qwen3_5_moe_text", num_layers=7, layer_types=(_LINEAR, _LINEAR, _FULL) * 2 + (_LINEAR,))
  assert scan.layer_period(hybrid) == 3
  qwen3_5 = ModelConfig.tiny("qwen3_5_moe_text", num_layers=40, layer_types=(_LINEAR, _LINEAR, _LINEAR, _FULL) * 10)
  assert scan.layer_period(qwen3_5) == 4
  # A dense first layer breaks every shorter period: one period of all layers (a scan of length 1).
  assert scan.layer_period(ModelConfig.tiny("qwen3_moe", num_layers=4, mlp_only_layers=(0,))) == 4


def test_stack_periods_layout():
  layers = [{"w": jnp.full((2,), float(i))} for i in range(7)]
  stacked = scan.stack_periods(layers, 3)  # layers 6 is left out (it runs after the scan)
  assert [s["w"].shape for s in stacked] == [(2, 2)] * 3
  np.testing.assert_array_equal(stacked[1]["w"][:, 0], [1.0, 4.0])
  with pytest.raises(ValueError, match="period"):
    scan.stack_periods(layers[:2], 3)


# Remat wraps each layer the same way whatever its kind, so one model type covers it, in the scan and after it (the
# hybrid's would cost ~2 min).
@pytest.mark.parametrize("name,remat", [("qwen3", "none"), ("qwen3_moe", "none"), ("qwen3_moe", "full"),
                                         ("qwen3_5_moe_text", "none")])
def test_scanned_equals_unrolled(name, remat):
  unrolled = _config(name, remat=remat)
  scanned = unrolled.replace(scan_layers=True)
  params = transformer.init_params(unrolled, jax.random.PRNGKey(0))
  ids, mask = _batch()
  logits, grads = _loss_and_grads(unrolled, params, ids, mask)
  scanned_logits, scanned_grads = _loss_and_grads(scanned, params, ids, mask)
  np.testing.assert_allclose(scanned_logits, logits, rtol=1e-5, atol=1e-5)
  assert jax.tree.structure(scanned_grads) == jax.tree.structure(params)
  for (path, g), g_scanned in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(scanned_grads)):
    scale = float(jnp.max(jnp.abs(g))) + 1e-12
    np.testing.assert_allclose(g_scanned, g, rtol=1e-4, atol=1e-5 * scale, err_msg=jax.tree_util.keystr(path))
  assert float(jnp.max(jnp.abs(grads["model"]["layers_0"]["post_attention_layernorm"]["scale"]))) > 0


def test_param_tree_unchanged():
  for name in CASES:
    config = _config(name)
    for critic in (False, True):
      plain = transformer.abstract_params(config, critic)
      scanned = transformer.abstract_params(config.replace(scan_layers=True), critic)
      assert jax.tree.structure(scanned, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned)) == \
          jax.tree.structure(plain, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
      assert jax.tree.map(lambda x: (x.shape, x.dtype), nn.meta.unbox(scanned)) == \
          jax.tree.map(lambda x: (x.shape, x.dtype), nn.meta.unbox(plain))


def test_critic_and_cached_calls():
  """The critic's values are scanned too; a call with a cache takes the unrolled loop (same logits and cache)."""
  config = _config("qwen3")
  scanned = config.replace(scan_layers=True)
  policy = transformer.init_params(config, jax.random.PRNGKey(0))
  critic = transformer.init_critic_from_policy(policy, jax.random.PRNGKey(3), init_scale=0.1)
  ids, mask = _batch()
  values = jax.jit(lambda p: transformer.Critic(config).apply({"params": p}, ids, mask))(critic)
  scanned_values = jax.jit(lambda p: transformer.Critic(scanned).apply({"params": p}, ids, mask))(critic)
  np.testing.assert_allclose(scanned_values, values, rtol=1e-5, atol=1e-6)
  cache = transformer.init_cache(config, 3, 16)
  logits, new_cache = transformer.CausalLM(config).apply({"params": policy}, ids, mask, cache)
  scanned_logits, scanned_cache = transformer.CausalLM(scanned).apply({"params": policy}, ids, mask, cache)
  np.testing.assert_array_equal(scanned_logits, logits)
  jax.tree.map(np.testing.assert_array_equal, scanned_cache, new_cache)


def test_bfloat16_carry():
  """bf16 params and activations keep the scan carry's dtype; the result tracks the unrolled one to bf16 rounding."""
  config = _config("qwen3_5_moe_text", dtype="bfloat16", param_dtype="bfloat16", num_layers=3,
                   layer_types=(_LINEAR, _FULL, _LINEAR))
  params = transformer.init_params(config, jax.random.PRNGKey(0))
  ids, mask = _batch()
  logits, _ = jax.jit(lambda p: transformer.CausalLM(config).apply({"params": p}, ids, mask))(params)
  scanned_logits, _ = jax.jit(
      lambda p: transformer.CausalLM(config.replace(scan_layers=True)).apply({"params": p}, ids, mask))(params)
  assert scanned_logits.dtype == jnp.float32
  np.testing.assert_allclose(scanned_logits, logits, atol=0.05 * float(jnp.max(jnp.abs(logits))))


def test_scan_layers_must_be_bool():
  with pytest.raises(ValueError, match="scan_layers"):
    ModelConfig.tiny("qwen3", scan_layers="yes")
