"""The hybrid model through the learner: the critic's default frozen patterns freeze exactly the attention tensors of
both block kinds (full `self_attn` and linear `linear_attn`), and a tiny qwen3_5_moe_text checkpoint trains as actor
and as frozen-attention critic, then exports back to a checkpoint transformers loads."""
import jax
import numpy as np
import pytest
import torch
import transformers

from sao.models import hf as hf_io
from sao.models.config import ModelConfig
from sao.models.transformer import abstract_params
from sao.train import optim
from sao.train.config import default_learner_config
from sao.train.learner import Learner
from tests.models.helpers import random_torch_model
from tests.train import helpers as train_helpers

# Per layer of ModelConfig.tiny(hybrid): linear_attn holds in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d,
# A_log, dt_bias, norm.scale, out_proj (9 tensors); self_attn holds q_proj, k_proj, v_proj, o_proj, q_norm, k_norm (6).
LINEAR_ATTN_TENSORS, SELF_ATTN_TENSORS = 9, 6


def _labels(config, patterns):
  params = jax.tree.map(lambda leaf: leaf.value, abstract_params(config, critic=True),
                        is_leaf=lambda x: hasattr(x, "names"))
  flat = {optim.param_path(path): label
          for path, label in jax.tree_util.tree_flatten_with_path(optim.param_labels(params, patterns))[0]}
  return params, flat


def test_default_critic_patterns_freeze_exactly_both_attention_kinds():
  config = ModelConfig.tiny("qwen3_5_moe_text", num_layers=4,
                            layer_types=("linear_attention",) * 3 + ("full_attention",))
  patterns = tuple(default_learner_config().critic.frozen_params)
  params, labels = _labels(config, patterns)
  frozen = sorted(path for path, label in labels.items() if label == optim.FROZEN)
  assert len(frozen) == 3 * LINEAR_ATTN_TENSORS + SELF_ATTN_TENSORS
  assert all("/linear_attn/" in p or "/self_attn/" in p for p in frozen)
  assert not any(("/linear_attn/" in p or "/self_attn/" in p) for p, label in labels.items()
                 if label == optim.TRAINABLE)
  counts = optim.count_params(params, optim.param_labels(params, patterns))
  attention = sum(int(np.prod(leaf.shape)) for (path, leaf) in jax.tree_util.tree_flatten_with_path(params)[0]
                  if "attn" in optim.param_path(path))
  assert counts.frozen == attention
  # The seed's lesson: `self_attn` alone leaves every linear-attention layer trainable.
  _, only_self = _labels(config, (".*self_attn.*",))
  assert sum(label == optim.FROZEN for label in only_self.values()) == SELF_ATTN_TENSORS


@pytest.mark.slow
def test_qwen3_5_moe_checkpoint_trains_as_actor_and_frozen_attention_critic(tmp_path):
  hf = ModelConfig.tiny("qwen3_5_moe_text", vocab_size=train_helpers.VOCAB, hidden_size=32, head_dim=8,
                        moe_intermediate_size=16, shared_expert_intermediate_size=24, intermediate_size=24).to_hf()
  hf["torch_dtype"] = "float32"
  random_torch_model(hf).save_pretrained(tmp_path / "base")
  config, params = hf_io.load_pretrained(str(tmp_path / "base"), linear_chunk_size=8)
  learner = Learner(train_helpers.learner_config(**{"sao.critic_warmup_steps": 0}), config, params,
                    mesh=train_helpers.one_device_mesh())
  assert learner.critic.counts.frozen > 0 and learner.actor.counts.frozen == 0
  actor0, critic0 = jax.device_get(learner.actor_params), jax.device_get(learner.critic_params)
  metrics = learner.update(train_helpers.trajectories(seed=0))  # K critic epochs, then one DIS actor step
  assert learner.version == 1
  assert np.isfinite(metrics["critic/grad_norm"]) and np.isfinite(metrics["actor/grad_norm"])
  actor, critic = jax.device_get(learner.actor_params), jax.device_get(learner.critic_params)
  assert not train_helpers.tree_equal(actor, actor0)
  for (path, label), a, b in zip(jax.tree_util.tree_flatten_with_path(learner.critic.labels)[0],
                                 jax.tree.leaves(critic0), jax.tree.leaves(critic)):
    name = optim.param_path(path)
    assert (label == optim.FROZEN) == ("/self_attn/" in name or "/linear_attn/" in name), name
    if label == optim.FROZEN:
      np.testing.assert_array_equal(a, b, err_msg=name)
    elif name in ("model/embed_tokens/embedding", "value_head/kernel"):
      assert not np.array_equal(a, b), f"trainable {name} did not change"
  # The trained policy exports to a checkpoint that transformers loads and that reads back bit-exactly (logit parity
  # of exports: test_hybrid.py::test_export_loads_in_transformers).
  hf_io.save_pretrained(config, actor, str(tmp_path / "trained"))
  torch_model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "trained"), dtype=torch.float32)
  with torch.no_grad():
    assert torch.isfinite(torch_model.eval()(input_ids=torch.arange(1, 12)[None]).logits).all()
  _, reloaded = hf_io.load_pretrained(str(tmp_path / "trained"), linear_chunk_size=8)
  assert train_helpers.tree_equal(reloaded, actor)
