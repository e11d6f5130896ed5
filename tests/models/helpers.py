"""Shared test helpers: tiny random HF torch models saved to disk, padded id batches."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from sao.models.config import ModelConfig
from sao.models.transformer import CausalLM, init_params

MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe")


def tiny_hf_config(model_type: str, **overrides) -> dict:
  """An HF config.json dict for a tiny model of `model_type` (GQA 4/2, 8 experts top-2 for MoE)."""
  hf = ModelConfig.tiny(model_type, **overrides).to_hf()
  hf["torch_dtype"] = "float32"
  return hf


def random_torch_model(hf_config: dict, seed: int = 0) -> torch.nn.Module:
  """A torch CausalLM with non-trivial random weights (std 0.1, norm scales 1 ± 0.1, random router)."""
  torch.manual_seed(seed)
  config = transformers.AutoConfig.for_model(**hf_config)
  model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
      else:
        p.normal_(0.0, 0.1)
  return model.eval()


def padded_batch(rng: np.random.Generator, vocab: int, lengths: list[int], total: int,
                 left: bool = True) -> tuple[np.ndarray, np.ndarray]:
  """Random ids [B, total] and mask [B, total] with each row's real tokens `lengths[b]`, left- or right-padded."""
  ids = rng.integers(0, vocab, size=(len(lengths), total)).astype(np.int32)
  mask = np.zeros((len(lengths), total), np.int32)
  for b, n in enumerate(lengths):
    if left:
      mask[b, total - n:] = 1
    else:
      mask[b, :n] = 1
  return ids, mask


def hf_positions(mask: np.ndarray) -> np.ndarray:
  """Position ids the way HF generate builds them from an attention mask."""
  pos = np.cumsum(mask, axis=1) - 1
  return np.where(mask == 1, pos, 1).astype(np.int64)


def random_params(config: ModelConfig, seed: int = 0, critic: bool = False) -> dict:
  """Our param tree with the same non-trivial random weights as `random_torch_model` (std 0.1, norms 1 ± 0.1)."""
  abstract = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0), critic=critic))
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    noise = rng.standard_normal(leaf.shape).astype(np.float32)
    is_norm = "norm" in jax.tree_util.keystr(path)
    return jnp.asarray((1.0 + 0.1 * noise) if is_norm else 0.1 * noise, leaf.dtype)

  return jax.tree_util.tree_map_with_path(fill, abstract)


def forward(config: ModelConfig, params: dict, ids, mask):
  """Jitted full forward → float32 logits [B, T, V] as numpy."""
  logits, _ = jax.jit(lambda p, i, m: CausalLM(config).apply({"params": p}, i, m))(params, ids, mask)
  return np.asarray(logits)
