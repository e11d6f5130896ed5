"""Shared fixtures for tests/train: a tiny model, synthetic trajectories, small learners."""
from __future__ import annotations

import jax
import numpy as np

from sao import run_config
from sao.models.config import ModelConfig
from sao.models.transformer import init_params
from sao.train import config as config_lib
from sao.train import mesh as mesh_lib
from sao.train.learner import Learner
from sao.transport.trajectory import Trajectory

VOCAB = 64


def model_config() -> ModelConfig:
  return ModelConfig.tiny("qwen3", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_heads=4,
                          num_kv_heads=2, head_dim=8)


def actor_params(seed: int = 0):
  return init_params(model_config(), jax.random.PRNGKey(seed))


def learner_config(**overrides):
  """Default config with fast test settings; `overrides` are dotted keys (`sao.critic_warmup_steps=0`)."""
  c = config_lib.default_learner_config()
  c.batching.bucket_lengths = (16, 32)
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 1, 1
  # One learning rate for every test: it is a compile-time constant, and tests share compiled steps through the
  # persistent compilation cache (conftest.py) only when their HLO is identical.
  c.actor.optimizer.learning_rate = 1e-2
  c.critic.optimizer.learning_rate = 1e-2
  c.actor.optimizer.warmup_steps = 0
  c.critic.optimizer.warmup_steps = 0
  return run_config.set_all(c, overrides)


def one_device_mesh():
  return mesh_lib.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])


def trajectories(seed: int, n: int = 8, min_len: int = 6, max_len: int = 16) -> list[Trajectory]:
  """Random multi-turn-looking trajectories: prompt, action span, observation span, action span."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    length = int(rng.integers(min_len, max_len + 1))
    ids = rng.integers(1, VOCAB, length)
    mask = np.zeros(length, bool)
    mask[2:length // 2] = True
    mask[length // 2 + 2:] = True
    logprobs = np.where(mask, rng.uniform(-5.0, -3.0, length), 0.0).astype(np.float32)
    out.append(Trajectory(task_id=f"t{seed}-{i}", token_ids=ids, action_mask=mask, rollout_logprobs=logprobs,
                          reward=float(rng.integers(0, 2)), group_id=f"g{i // 2}", policy_version=0))
  return out


def make_learner(config=None, mesh=None, seed: int = 0, **overrides) -> Learner:
  config = config if config is not None else learner_config(**overrides)
  return Learner(config, model_config(), actor_params(seed), mesh=mesh if mesh is not None else one_device_mesh())


def tree_equal(a, b) -> bool:
  return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
