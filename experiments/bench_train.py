r"""Throughput of one SAO learner update on CPU, beside the machine's measured float32 matmul peak.

One update = critic forward, K critic steps, critic forward, advantages, one DIS actor step. Achieved FLOP/s counts
`6·P·tokens` per training step (forward + backward) and `2·P·tokens` per forward, for the actor and the critic
(attention's T² term and the head are left out, as in the usual MFU convention); the peak is a jitted
`[n, n] @ [n, n]` float32 matmul timed in the same run, and their ratio is the MFU-like figure.

  python experiments/bench_train.py --batch=8 --seq_len=256 --steps=3
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from sao.models.config import ModelConfig
from sao.models.transformer import init_params
from sao.train import config as config_lib
from sao.train.learner import Learner
from sao.train.mesh import make_mesh
from sao.transport.trajectory import Trajectory

_BATCH = flags.DEFINE_integer("batch", 8, "trajectories per update")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 256, "tokens per trajectory")
_STEPS = flags.DEFINE_integer("steps", 3, "timed updates (after one compile/warm-up update)")
_HIDDEN = flags.DEFINE_integer("hidden", 256, "hidden size of the Qwen3 config")
_LAYERS = flags.DEFINE_integer("layers", 4, "decoder layers")
_VOCAB = flags.DEFINE_integer("vocab", 4096, "vocabulary size")
_MATMUL = flags.DEFINE_integer("matmul", 2048, "side of the peak-FLOP/s matmul")


def _param_count(params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def _matmul_peak(n: int, repeats: int = 5) -> float:
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
  f = jax.jit(lambda x, y: x @ y)
  f(a, b).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2.0 * n ** 3 / best


def _trajectories(rng: np.random.Generator, batch: int, seq_len: int, vocab: int) -> list[Trajectory]:
  out = []
  for i in range(batch):
    mask = np.zeros(seq_len, bool)
    mask[seq_len // 8:] = True
    mask[seq_len // 2: seq_len // 2 + seq_len // 8] = False  # a tool observation
    out.append(Trajectory(task_id=str(i), token_ids=rng.integers(0, vocab, seq_len), action_mask=mask,
                          rollout_logprobs=np.where(mask, -2.0, 0.0).astype(np.float32),
                          reward=float(rng.integers(0, 2))))
  return out


def main(argv):
  del argv
  hidden = _HIDDEN.value
  model_config = ModelConfig.tiny("qwen3", vocab_size=_VOCAB.value, hidden_size=hidden,
                                  intermediate_size=3 * hidden, num_layers=_LAYERS.value, num_heads=hidden // 64,
                                  num_kv_heads=max(hidden // 128, 1), head_dim=64)
  config = config_lib.default_learner_config()
  config.sao.critic_warmup_steps = 0
  config.mesh.update(data=1, fsdp=1, tensor=1)
  config.batching.bucket_lengths = (_SEQ_LEN.value,)
  actor_params = init_params(model_config, jax.random.PRNGKey(0))
  mesh = make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
  learner = Learner(config, model_config, actor_params, mesh=mesh)
  rng = np.random.default_rng(0)
  t = time.perf_counter()
  learner.update(_trajectories(rng, _BATCH.value, _SEQ_LEN.value, _VOCAB.value))
  compile_s = time.perf_counter() - t
  times = []
  for _ in range(_STEPS.value):
    trajs = _trajectories(rng, _BATCH.value, _SEQ_LEN.value, _VOCAB.value)
    t = time.perf_counter()
    learner.update(trajs)  # returns host floats: the update has finished
    times.append(time.perf_counter() - t)
  step_s = float(np.median(times))
  tokens = _BATCH.value * _SEQ_LEN.value
  p_actor = _param_count(learner.actor_params)
  p_critic = _param_count(learner.critic_params)
  k = config.sao.critic_epochs
  flops = 6 * p_actor * tokens + k * 6 * p_critic * tokens + 2 * 2 * p_critic * tokens
  achieved = flops / step_s
  peak = _matmul_peak(_MATMUL.value)
  print(f"model: qwen3 hidden={hidden} layers={_LAYERS.value} vocab={_VOCAB.value}; actor params {p_actor:,}, "
        f"critic params {p_critic:,}")
  print(f"batch [B, T] = [{_BATCH.value}, {_SEQ_LEN.value}] = {tokens} tokens; K = {k} critic epochs")
  print(f"first update (compile + run): {compile_s:.1f} s; update: median {step_s:.3f} s over {len(times)}")
  print(f"throughput: {tokens / step_s:,.0f} tokens/s; achieved {achieved / 1e9:.2f} GFLOP/s "
        f"(6·P·tokens actor + {k}·6·P·tokens + 2·2·P·tokens critic)")
  print(f"float32 matmul peak ({_MATMUL.value}³): {peak / 1e9:.2f} GFLOP/s; ratio (MFU-like) {achieved / peak:.3f}")


if __name__ == "__main__":
  app.run(main)
