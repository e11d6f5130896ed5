"""Shared by engine and rollout tests: a tiny random model + the toy tokenizer saved as one HF directory, and a
local engine server subprocess on a loopback port."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from sao.engines.local_server import LocalEngineProcess, start_local_engine
from sao.models.config import ModelConfig
from sao.models.hf import save_pretrained
from sao.models.tokenizer import toy_tokenizer
from sao.models.transformer import abstract_params

# Coarse buckets: few distinct shapes, so each test module compiles a handful of programs.
ENGINE_ARGS = ("--prompt_buckets=256,512", "--batch_buckets=8,128", "--new_token_buckets=16",
               "--batch_window_ms=5")


def tiny_config(vocab_size: int) -> ModelConfig:
  """One layer, hidden 32: small enough that a 128-row batch decodes in well under a second on 2 CPU cores."""
  return ModelConfig.tiny("qwen3", vocab_size=vocab_size, num_layers=1, hidden_size=32, intermediate_size=64,
                          num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=512)


def save_tiny_model(directory: str, seed: int = 0, scale: float = 1.0) -> str:
  """A random tiny qwen3 (vocab = the toy tokenizer's) + the toy tokenizer in one HF directory; returns it.

  `scale` multiplies the random weights: larger values give peakier next-token distributions."""
  tokenizer = toy_tokenizer()
  config = tiny_config(tokenizer.vocab_size)
  # Filled with numpy (no jitted init to compile): std 0.1 weights, norm scales 1 ± 0.1, times `scale`.
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    noise = rng.standard_normal(leaf.shape).astype(np.float32)
    base = 1.0 + 0.1 * noise if "norm" in jax.tree_util.keystr(path) else 0.1 * scale * noise
    return jnp.asarray(base, leaf.dtype)

  params = jax.tree_util.tree_map_with_path(fill, abstract_params(config))
  save_pretrained(config, params, directory)
  tokenizer.save_pretrained(directory)
  return directory


def start_engine(model_dir: str, cache_dir: str, *extra_args: str) -> tuple[LocalEngineProcess, str]:
  """A local engine subprocess on 127.0.0.1 (free port) sharing a JAX compilation cache across test modules."""
  os.makedirs(cache_dir, exist_ok=True)
  env = dict(os.environ)
  env["XLA_FLAGS"] = ""  # the server needs one device, not the test suite's 8 fake ones
  env["JAX_PLATFORMS"] = "cpu"
  return start_local_engine(model_dir, port=0, engine_args=[*ENGINE_ARGS, f"--compilation_cache_dir={cache_dir}",
                                                            *extra_args], env=env, startup_timeout_s=180)
