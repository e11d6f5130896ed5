"""Architectures of the published checkpoints the experiment configs name, so shapes exist without the checkpoint.

`hf_config(path)` returns the HF `config.json` dict of `path`: read from `path/config.json` when that directory
exists (a local copy always wins), else from `KNOWN_HF_CONFIGS` for the hub ids below. Ahead-of-time compilation
(`sao.aot.driver`) builds the model from it without downloading tens of gigabytes of weights.

Sources: the models' HF `config.json` files; the same values are the defaults of transformers'
`Qwen3_5MoeTextConfig` (checkpoint Qwen/Qwen3.5-35B-A3B) and, for Qwen3-30B-A3B, its model card (48 layers, 32 q /
4 kv heads, 128 experts top-8, expert width 768).
"""
from __future__ import annotations

import json
import os
from typing import Any

KNOWN_HF_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3.5-35B-A3B": {
        "model_type": "qwen3_5_moe",
        "tie_word_embeddings": False,
        "text_config": dict(
            model_type="qwen3_5_moe_text", vocab_size=248320, hidden_size=2048, num_hidden_layers=40,
            num_attention_heads=16, num_key_value_heads=2, head_dim=256, num_experts=256, num_experts_per_tok=8,
            moe_intermediate_size=512, shared_expert_intermediate_size=512, linear_num_key_heads=16,
            linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
            full_attention_interval=4, rms_norm_eps=1e-6, max_position_embeddings=262144,
            rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                             "mrope_section": [11, 11, 10], "mrope_interleaved": True}),
    },
    "Qwen/Qwen3-30B-A3B": dict(
        model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        moe_intermediate_size=768, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=40960, tie_word_embeddings=False,
        attention_bias=False),
}


def hf_config(path: str) -> dict[str, Any]:
  """The HF config dict of a checkpoint directory or a known hub id; ValueError naming `path` otherwise."""
  config_file = os.path.join(path, "config.json")
  if os.path.isfile(config_file):
    with open(config_file) as f:
      return json.load(f)
  if path in KNOWN_HF_CONFIGS:
    return json.loads(json.dumps(KNOWN_HF_CONFIGS[path]))  # a deep copy
  raise ValueError(f"model.hf_path: {path!r} has no config.json and is not a known hub id "
                   f"({sorted(KNOWN_HF_CONFIGS)}); pass a directory holding the checkpoint's config.json")
