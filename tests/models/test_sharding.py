"""Partition specs on a (data=2, fsdp=2, tensor=2) mesh of the 8 fake devices; sharded forward == unsharded."""
import jax
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from sao.models.config import ModelConfig
from sao.models.sharding import batch_sharding, logical_to_spec, param_partition_specs, param_shardings
from sao.models.transformer import CausalLM, Critic, init_params
from tests.models.helpers import MODEL_TYPES, forward, padded_batch, random_params


def _mesh(**axes):
  devices = np.array(jax.devices()[:8]).reshape(tuple(axes.values()))
  return Mesh(devices, tuple(axes))


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_partition_specs_and_sharded_forward(model_type):
  mesh = _mesh(data=2, fsdp=2, tensor=2)
  config = ModelConfig.tiny(model_type, tie_word_embeddings=model_type == "llama")
  specs = param_partition_specs(config, mesh)
  layer = specs["model"]["layers_0"]
  assert specs["model"]["embed_tokens"]["embedding"] == P("tensor", "fsdp")
  # Kernels in HF's layout [out..., in...]: the specs name the same logical dims, in that order.
  assert layer["self_attn"]["q_proj"]["kernel"] == P("tensor", None, "fsdp")
  assert layer["self_attn"]["k_proj"]["kernel"] == P("tensor", None, "fsdp")
  assert layer["self_attn"]["o_proj"]["kernel"] == P("fsdp", "tensor", None)
  assert layer["input_layernorm"]["scale"] == P(None)
  if model_type == "qwen2":
    assert layer["self_attn"]["q_proj"]["bias"] == P("tensor", None)
  if model_type == "qwen3_moe":
    assert layer["mlp"]["experts"]["gate_proj"] == P(None, "tensor", "fsdp")  # no `expert` axis in this mesh
    assert layer["mlp"]["experts"]["down_proj"] == P(None, "fsdp", "tensor")
    assert layer["mlp"]["gate"]["kernel"] == P(None, "fsdp")
  else:
    assert layer["mlp"]["gate_proj"]["kernel"] == P("tensor", "fsdp")
    assert layer["mlp"]["down_proj"]["kernel"] == P("fsdp", "tensor")
  if not config.tie_word_embeddings:
    assert specs["lm_head"]["kernel"] == P("tensor", "fsdp")

  params = random_params(config, seed=1)
  assert jax.tree.structure(specs) == jax.tree.structure(params)
  ids, mask = padded_batch(np.random.default_rng(0), config.vocab_size, [8, 3, 5, 1], 8)
  want = forward(config, params, ids, mask)
  sharded = jax.device_put(params, param_shardings(config, mesh))
  assert sharded["model"]["layers_0"]["self_attn"]["q_proj"]["kernel"].sharding.spec == P("tensor", None, "fsdp")
  data = batch_sharding(mesh)
  got, _ = jax.jit(lambda p, i, m: CausalLM(config).apply({"params": p}, i, m))(
      sharded, jax.device_put(ids, data), jax.device_put(mask, data))
  real = mask.astype(bool)
  assert np.abs(np.asarray(got)[real] - want[real]).max() <= 1e-5


def test_expert_parallel_mesh_and_critic_specs():
  mesh = _mesh(data=2, expert=2, tensor=2)
  config = ModelConfig.tiny("qwen3_moe")
  specs = param_partition_specs(config, mesh, critic=True)
  assert specs["model"]["layers_0"]["mlp"]["experts"]["gate_proj"] == P("expert", "tensor", None)
  assert specs["value_head"]["kernel"] == P(None, None) and "lm_head" not in specs
  shardings = param_shardings(config, mesh, critic=True)
  initialised = init_params(config, jax.random.PRNGKey(0), critic=True, shardings=shardings)
  assert initialised["model"]["layers_1"]["mlp"]["experts"]["up_proj"].sharding.spec == P("expert", "tensor", None)
  params = random_params(config, seed=2, critic=True)
  want = jax.jit(lambda p, i: Critic(config).apply({"params": p}, i))(params, np.arange(16).reshape(4, 4))
  got = jax.jit(lambda p, i: Critic(config).apply({"params": p}, i))(
      jax.device_put(params, shardings),
      jax.device_put(np.arange(16).reshape(4, 4), batch_sharding(mesh)))
  # Tensor- and expert-parallel partial sums are reduced in another order: float32 rounding of values up to ~2
  # (measured 4e-7), the same bound as the sharded logits above.
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)


def test_rules_drop_missing_and_indivisible_axes():
  mesh = _mesh(data=2, fsdp=2, tensor=2)
  assert logical_to_spec(("heads", "head_dim"), (3, 16), mesh) == P(None, None)  # 3 heads do not split by 2
  assert logical_to_spec(("batch", None), (8, 5), mesh) == P(("data", "fsdp"), None)
  assert logical_to_spec(("batch", None), (2, 5), mesh) == P("data", None)
  with pytest.raises(ValueError, match="'nonsense'"):
    logical_to_spec(("nonsense",), (4,), mesh)
  with pytest.raises(ValueError, match="params_or_config"):
    param_partition_specs({"w": np.zeros(3)}, mesh)
