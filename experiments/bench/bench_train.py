r"""Throughput of one SAO learner update on CPU, beside the machine's measured float32 matmul peak.

One update = critic forward (only when the critic reads V⁰: λ_critic < 1 or a value clip), K critic steps, critic
forward, advantages, one DIS actor step. Achieved FLOP/s counts
`6·P·tokens` per training step (forward + backward) and `2·P·tokens` per forward, for the actor and the critic
(attention's T² term and the head are left out, as in the usual MFU convention); the peak is a jitted
`[n, n] @ [n, n]` float32 matmul timed in the same run (before and after the updates, the better kept), and their
ratio is the MFU-like figure. The same ratio per CPU-second of this process is printed beside it: on a shared
machine other jobs stretch wall time far more than CPU time.

  python experiments/bench/bench_train.py --batch=8 --seq_len=256 --steps=3

`--mode=toy_batch`: the README main job's learner update instead (the `sao_openswe.py:toy` learner config and model,
64 trajectories of the toy's lengths: replayed from a run's trajectory log with `--lengths_from=<workdir>/trajectories`,
else drawn from that log's length quantiles), reporting the update's CPU ms (this process's user + system time, which
other jobs on a shared machine move far less than wall time), the first updates' (compiling) CPU seconds and the
padded / grouped / real token counts; `--length_groups` overrides the config's `batching.length_groups`
(−1: keep it), `--bucket_lengths` (`+`-separated) its buckets:

  python experiments/bench/bench_train.py --mode=toy_batch --length_groups=0 --steps=8
"""
from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

# the repository, two folders up: this checkout's `sao`
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.bench import synthetic
from experiments.configs import sao_openswe

from sao.models.config import ModelConfig
from sao.models.transformer import init_params
from sao.train import config as config_lib
from sao.train.learner import Learner
from sao.train.mesh import make_mesh
from sao.train import batching, steps, targets
from sao.transport import log as log_lib
from sao.transport.trajectory import Trajectory

_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch.BACKEND_COMPILE_EVENT


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import: tests import every command in one process, and
  commands share flag names, e.g. `--config`, `--out`, `--batch`)."""
  global _BATCH, _SEQ_LEN, _STEPS, _HIDDEN, _LAYERS, _VOCAB, _MATMUL, _MODE  # pylint: disable=global-statement
  global _LENGTH_GROUPS, _BUCKETS, _LENGTHS_FROM, _WARMUP, _TOY_VOCAB  # pylint: disable=global-statement
  _BATCH = flags.DEFINE_integer("batch", 8, "trajectories per update")
  _SEQ_LEN = flags.DEFINE_integer("seq_len", 256, "tokens per trajectory")
  _STEPS = flags.DEFINE_integer("steps", 3, "timed updates (after one compile/warm-up update)")
  _HIDDEN = flags.DEFINE_integer("hidden", 256, "hidden size of the Qwen3 config")
  _LAYERS = flags.DEFINE_integer("layers", 4, "decoder layers")
  _VOCAB = flags.DEFINE_integer("vocab", 4096, "vocabulary size")
  _MATMUL = flags.DEFINE_integer("matmul", 2048, "side of the peak-FLOP/s matmul")
  _MODE = flags.DEFINE_enum("mode", "synthetic", ["synthetic", "toy_batch"], "see the module docstring")
  _LENGTH_GROUPS = flags.DEFINE_integer("length_groups", -1, "toy_batch: batching.length_groups (-1: the config's)")
  _BUCKETS = flags.DEFINE_string("bucket_lengths", "", "toy_batch: batching.bucket_lengths, '+'-separated ('': config)")
  _LENGTHS_FROM = flags.DEFINE_string("lengths_from", "", "toy_batch: a trajectory log directory to replay")
  _WARMUP = flags.DEFINE_integer("warmup", 6, "toy_batch: untimed (compiling) updates before the timed ones")
  _TOY_VOCAB = flags.DEFINE_integer("toy_vocab", 643, "toy_batch: vocabulary of the toy tokenizer (its base_model's)")


# Token counts of the README main job's trajectories at the 0, 5, …, 100th percentiles (16 128 trajectories of one
# 160-step run's log): turns of ≈ 20 tokens, mean 86, median 97, max 164.
_TOY_LENGTH_QUANTILES = (37, 37, 57, 57, 57, 77, 77, 77, 77, 77, 97, 97, 97, 97, 101, 101, 101, 102, 118, 121, 164)


def _param_count(params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def _matmul_peak(n: int, repeats: int = 5) -> tuple[float, float]:
  """(FLOP/s, FLOP per CPU-second) of a jitted `[n, n] @ [n, n]` float32 matmul, each the best of `repeats`."""
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
  f = jax.jit(lambda x, y: x @ y)
  f(a, b).block_until_ready()
  best, best_cpu = float("inf"), float("inf")
  for _ in range(repeats):
    t, cpu = time.perf_counter(), _cpu_s()
    f(a, b).block_until_ready()
    best, best_cpu = min(best, time.perf_counter() - t), min(best_cpu, _cpu_s() - cpu)
  return 2.0 * n ** 3 / best, 2.0 * n ** 3 / best_cpu


_trajectories = synthetic.synthetic_trajectories


def _cpu_s() -> float:
  return time.process_time()  # user + system CPU of this process, all threads


def _toy_trajectories(rng: np.random.Generator, batch: int, vocab: int, replay: list[Trajectory]) -> list[Trajectory]:
  if replay:
    return [replay[i] for i in rng.integers(0, len(replay), batch)]
  quantiles = np.asarray(_TOY_LENGTH_QUANTILES, np.float64)
  out = []
  for i in range(batch):
    n = int(np.interp(rng.uniform(0, len(quantiles) - 1), np.arange(len(quantiles)), quantiles))
    mask = np.zeros(n, bool)
    for start in range(20, n, 20):  # a prompt, then ≈ 20-token turns: 6 action tokens, then the observation
      mask[start:start + 6] = True
    out.append(Trajectory(task_id=str(i), token_ids=rng.integers(0, vocab, n), action_mask=mask,
                          rollout_logprobs=np.where(mask, -2.0, 0.0).astype(np.float32),
                          reward=float(rng.integers(0, 2))))
  return out


def toy_batch() -> None:
  """The main job's learner update on its batch shapes (see the module docstring)."""
  config = sao_openswe.get_config("toy")
  learner_config = config.learner
  learner_config.unlock()
  learner_config.sao.critic_warmup_steps = 0  # every update has the actor step, as after the main job's warmup
  if _LENGTH_GROUPS.value >= 0:
    learner_config.batching.length_groups = _LENGTH_GROUPS.value
  if _BUCKETS.value:
    learner_config.batching.bucket_lengths = tuple(int(b) for b in _BUCKETS.value.split("+"))
  learner_config.mesh.update(data=1, fsdp=1, tensor=1)
  toy = dict(config.model.toy)
  model_config = ModelConfig.tiny(toy.pop("model_type"), vocab_size=_TOY_VOCAB.value, **toy)
  mesh = make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
  learner = Learner(learner_config, model_config, init_params(model_config, jax.random.PRNGKey(0)), mesh=mesh)
  replay = []
  if _LENGTHS_FROM.value:
    replay = [t for t in log_lib.read_trajectories(_LENGTHS_FROM.value)
              if t.is_trainable and t.num_action_tokens and max(t.token_ids) < _TOY_VOCAB.value]
  rng = np.random.default_rng(0)
  batch_size = config.rollout.batch_size
  compiles = []  # every XLA compile in this process (a jit cache miss), not only the steps' traces
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, duration, **kw: compiles.append(duration) if event == _BACKEND_COMPILE_EVENT else None)
  c = learner_config.batching
  cpu = _cpu_s()
  for _ in range(_WARMUP.value):
    learner.update(_toy_trajectories(rng, batch_size, _TOY_VOCAB.value, replay))
  warmup_cpu = _cpu_s() - cpu
  cpu_ms, wall_ms, padded, grouped, real, compiling_cpu_s = [], [], [], [], [], []
  for _ in range(_STEPS.value):
    batch, _ = learner.make_batch(_toy_trajectories(rng, batch_size, _TOY_VOCAB.value, replay))
    compiled_before = len(compiles)
    cpu, wall = _cpu_s(), time.perf_counter()
    learner.update(batch)  # returns host floats: the update has finished
    if len(compiles) != compiled_before:  # a new shape (a step's group, or the whole batch's T): this update compiled
      compiling_cpu_s.append(_cpu_s() - cpu)
      continue
    cpu_ms.append(1e3 * (_cpu_s() - cpu))
    wall_ms.append(1e3 * (time.perf_counter() - wall))
    padded.append(batch["input_ids"].size)
    real.append(int(batch["attention_mask"].sum()))
    groups = batching.length_groups(batch["attention_mask"], c.length_groups or 1, learner.batcher.batch_multiple,
                                    learner.batcher.bucket_lengths)
    grouped.append(sum(len(g.rows) * g.length for g in groups))
  print(f"toy learner update: B = {batch_size}, length_groups = {c.length_groups}, buckets {tuple(c.bucket_lengths)}, "
        f"lengths {'replayed from ' + _LENGTHS_FROM.value if replay else 'drawn from the toy quantiles'}")
  print(f"first {_WARMUP.value} updates: {warmup_cpu:.1f} CPU-s; {len(compiling_cpu_s)} later updates met a new "
        f"shape (compiled): {sum(compiling_cpu_s):.1f} CPU-s; traced programs {dict(steps.TRACE_COUNTS)}")
  if not cpu_ms:
    return
  print(f"update without compiling: median {np.median(cpu_ms):.0f} CPU ms (mean {np.mean(cpu_ms):.0f}, "
        f"min {np.min(cpu_ms):.0f}) over {len(cpu_ms)}; wall median {np.median(wall_ms):.0f} ms")
  print(f"tokens per update: padded [B, T] {np.mean(padded):.0f}, trained (groups) {np.mean(grouped):.0f}, "
        f"real {np.mean(real):.0f}")


def main(argv):
  del argv
  if _MODE.value == "toy_batch":
    toy_batch()
    return
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
  # The peak is timed before and after the updates and the better kept: on a shared machine a peak timed only once
  # can land in a busier or quieter moment than the updates and move the ratio either way.
  peak, peak_per_cpu_s = _matmul_peak(_MATMUL.value)
  times, cpu_times = [], []
  for _ in range(_STEPS.value):
    trajs = _trajectories(rng, _BATCH.value, _SEQ_LEN.value, _VOCAB.value)
    t, cpu = time.perf_counter(), _cpu_s()
    learner.update(trajs)  # returns host floats: the update has finished
    times.append(time.perf_counter() - t)
    cpu_times.append(_cpu_s() - cpu)
  step_s, step_cpu_s = float(np.median(times)), float(np.median(cpu_times))
  tokens = _BATCH.value * _SEQ_LEN.value
  p_actor = _param_count(learner.actor_params)
  p_critic = _param_count(learner.critic_params)
  k = config.sao.critic_epochs
  forwards = 2 if targets.critic_reads_values_before(config) else 1  # V⁰ before the critic's epochs, V after
  flops = 6 * p_actor * tokens + k * 6 * p_critic * tokens + forwards * 2 * p_critic * tokens
  achieved = flops / step_s
  after, after_per_cpu_s = _matmul_peak(_MATMUL.value)
  peak, peak_per_cpu_s = max(peak, after), max(peak_per_cpu_s, after_per_cpu_s)
  print(f"model: qwen3 hidden={hidden} layers={_LAYERS.value} vocab={_VOCAB.value}; actor params {p_actor:,}, "
        f"critic params {p_critic:,}")
  print(f"batch [B, T] = [{_BATCH.value}, {_SEQ_LEN.value}] = {tokens} tokens; K = {k} critic epochs")
  print(f"first update (compile + run): {compile_s:.1f} s; update: median {step_s:.3f} s over {len(times)}")
  print(f"throughput: {tokens / step_s:,.0f} tokens/s; achieved {achieved / 1e9:.2f} GFLOP/s "
        f"(6·P·tokens actor + {k}·6·P·tokens + {forwards}·2·P·tokens critic)")
  print(f"float32 matmul peak ({_MATMUL.value}³): {peak / 1e9:.2f} GFLOP/s; ratio (MFU-like) {achieved / peak:.3f}")
  print(f"per CPU-second (this process's user + system time, which other jobs move far less than wall time): "
        f"update median {step_cpu_s:.3f} CPU-s, {flops / step_cpu_s / 1e9:.2f} GFLOP per CPU-s vs the peak's "
        f"{peak_per_cpu_s / 1e9:.2f}; ratio {flops / step_cpu_s / peak_per_cpu_s:.3f}; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
  define_flags()
  app.run(main)
