"""ModelConfig ↔ HF config.json; bad configs and bad checkpoints fail with errors that name the culprit."""
import json

import numpy as np
import pytest
import safetensors.numpy
import transformers

from sao.models import hf as hf_io
from sao.models.config import ModelConfig
from tests.models.helpers import MODEL_TYPES, random_params


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_hf_config_round_trip(model_type):
  config = ModelConfig.tiny(model_type, rope_theta=1e6, eos_token_id=(1, 2))
  # Through transformers' own config class and back (v5 renames num_experts → num_local_experts, rope_parameters).
  hf_dict = transformers.AutoConfig.for_model(**config.to_hf()).to_dict()
  again = ModelConfig.from_hf(hf_dict)
  assert again == config
  assert again.layer_types == ("full_attention",) * config.num_layers
  if model_type == "qwen3_moe":
    assert again.num_experts == 8 and again.is_moe_layer(0)


def test_config_fields():
  assert ModelConfig.tiny("qwen2").attention_bias and not ModelConfig.tiny("qwen2").attention_out_bias
  assert ModelConfig.tiny("qwen3").qk_norm
  cfg = ModelConfig.tiny("qwen3_moe", decoder_sparse_step=2, mlp_only_layers=(1,), num_layers=4)
  assert [cfg.is_moe_layer(i) for i in range(4)] == [False, False, False, True]
  hf = ModelConfig.tiny("llama").to_hf()
  del hf["rope_theta"]
  hf["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}
  assert ModelConfig.from_hf(hf).rope_theta == 5e5


@pytest.mark.parametrize("change, field", [
    ({"model_type": "gpt2"}, "model_type"),
    ({"num_key_value_heads": 3}, "num_kv_heads"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, r"layer_types\[1\]"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"vocab_size": -1}, "vocab_size"),
])
def test_bad_config_names_the_field(change, field):
  hf = ModelConfig.tiny("qwen3_moe").to_hf()
  hf.update(change)
  with pytest.raises(ValueError, match=field):
    ModelConfig.from_hf(hf)
  with pytest.raises(ValueError, match="num_hidden_layers"):
    ModelConfig.from_hf({k: v for k, v in ModelConfig.tiny("qwen3").to_hf().items() if k != "num_hidden_layers"})
  with pytest.raises(ValueError, match="dtype"):
    ModelConfig.tiny("qwen3", dtype="float16")
  with pytest.raises(ValueError, match="remat"):
    ModelConfig.tiny("qwen3", remat="sometimes")


def _write(directory, config, tensors):
  directory.mkdir(exist_ok=True)
  (directory / "config.json").write_text(json.dumps(config.to_hf()))
  safetensors.numpy.save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})


def test_missing_unknown_and_misshaped_tensors(tmp_path):
  config = ModelConfig.tiny("qwen3_moe")
  tensors = hf_io.to_hf_tensors(random_params(config))
  assert "model.layers.0.mlp.experts.7.down_proj.weight" in tensors
  _write(tmp_path / "ok", config, tensors)
  loaded_config, _ = hf_io.load_pretrained(str(tmp_path / "ok"))
  assert loaded_config == config

  missing = dict(tensors)
  del missing["model.layers.1.self_attn.k_norm.weight"], missing["model.layers.0.mlp.experts.3.up_proj.weight"]
  _write(tmp_path / "missing", config, missing)
  with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_norm\.weight.*expert 3"):
    hf_io.load_pretrained(str(tmp_path / "missing"))

  unknown = dict(tensors, **{"model.layers.0.self_attn.rotary.inv_freq": np.zeros(8, np.float32),
                             "model.layers.0.mlp.experts.8.up_proj.weight": np.zeros((32, 64), np.float32)})
  _write(tmp_path / "unknown", config, unknown)
  with pytest.raises(ValueError, match=r"experts\.8\.up_proj.*rotary\.inv_freq"):
    hf_io.load_pretrained(str(tmp_path / "unknown"))

  bad = dict(tensors, **{"model.norm.weight": np.zeros(63, np.float32)})
  _write(tmp_path / "bad", config, bad)
  with pytest.raises(ValueError, match=r"model\.norm\.weight"):
    hf_io.load_pretrained(str(tmp_path / "bad"))
  # Same element count, transposed: q_proj is [H·D, E] = [64, 64] here, k_proj [32, 64] must not load as [64, 32].
  transposed = dict(tensors, **{"model.layers.0.self_attn.k_proj.weight": np.zeros((64, 32), np.float32)})
  _write(tmp_path / "transposed", config, transposed)
  with pytest.raises(ValueError, match=r"k_proj\.weight: shape \(64, 32\), expected \(32, 64\)"):
    hf_io.load_pretrained(str(tmp_path / "transposed"))

  # A policy checkpoint is not a critic checkpoint: lm_head is unknown, score.* is missing.
  with pytest.raises(ValueError, match=r"unknown tensors \[.lm_head\.weight.\].*score\.weight"):
    hf_io.load_pretrained(str(tmp_path / "ok"), critic=True)


def test_critic_checkpoint_round_trip_in_bfloat16(tmp_path):
  config = ModelConfig.tiny("qwen3", param_dtype="bfloat16", dtype="bfloat16")
  params = random_params(config, seed=3, critic=True)
  hf_io.save_pretrained(config, params, str(tmp_path))
  names = safetensors.numpy.load_file(str(tmp_path / "model.safetensors"))
  assert names["score.weight"].shape == (1, 64) and names["score.bias"].shape == (1,)
  assert "lm_head.weight" not in names and str(names["score.weight"].dtype) == "bfloat16"
  with pytest.raises(ValueError, match="score"):
    hf_io.load_pretrained(str(tmp_path))
  loaded_config, loaded = hf_io.load_pretrained(str(tmp_path), dtype="bfloat16", critic=True)
  assert loaded_config == config
  np.testing.assert_array_equal(np.asarray(loaded["value_head"]["kernel"], np.float32),
                                np.asarray(params["value_head"]["kernel"], np.float32))
