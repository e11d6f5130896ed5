"""The rows of the accelerator check (`bench_accelerator.py`), each the body of one process: the learner rows (dense
Qwen3-1.7B geometry, Qwen3-30B-A3B layer geometry), the README main job, and the local engine's decode.

Every row writes its records through an `accelerator_probe.Recorder` as it goes, so a row killed at its time limit
keeps what it measured before. `tiny=True` runs the same code at toy sizes (CPU, tests).
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any

# the repository, two folders up: this checkout's `sao` and `experiments`
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.bench import accelerator_probe as probe  # noqa: E402

GB = 1e9
H200_BYTES = 141 * GB  # one H200's HBM3e, as sold; the row uses `memory_stats()['bytes_limit']` when reported
# Qwen3-1.7B's config.json (dense, tied embeddings) and Qwen3-30B-A3B's (48 layers, 128 experts, top-8, untied).
QWEN3_1P7B = dict(model_type="qwen3", vocab_size=151_936, hidden_size=2048, intermediate_size=6144, num_layers=28,
                  num_heads=16, num_kv_heads=8, head_dim=128, qk_norm=True, tie_word_embeddings=True,
                  rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=40_960)
QWEN3_30B_A3B = dict(model_type="qwen3_moe", vocab_size=151_936, hidden_size=2048, intermediate_size=6144,
                     num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128, qk_norm=True, num_experts=128,
                     num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True, rope_theta=1e6,
                     rms_norm_eps=1e-6, max_position_embeddings=40_960, tie_word_embeddings=False)
TRAINING = dict(dtype="bfloat16", param_dtype="float32", remat="full", scan_layers=True)
# Toy stand-ins (`--tiny`): the same code paths at sizes a CPU runs in seconds.
TINY_DENSE = dict(vocab_size=512, hidden_size=64, intermediate_size=192, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=16)
TINY_MOE = dict(vocab_size=512, hidden_size=64, intermediate_size=192, num_layers=2, num_heads=4, num_kv_heads=2,
                head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
# Bytes per parameter of a role's state: float32 params + AdamW's two float32 moments; while a role steps, its float32
# gradients and a bf16 compute copy of its params (the roles step one at a time: only the larger role's count).
STATE_BYTES, STEP_BYTES = 12, 4 + 2


def model_config(geometry: dict, **overrides):
  from sao.models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  return ModelConfig(**{**geometry, **TRAINING, **overrides})


def tiny_config(model_type: str, geometry: dict, **overrides):
  from sao.models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  return ModelConfig.tiny(model_type, **{**geometry, **TRAINING, **overrides})


def role_param_counts(config) -> tuple[int, int]:
  """(actor, critic) parameter counts, from abstract shapes (nothing allocated)."""
  import jax  # pylint: disable=g-import-not-at-top
  from sao.models.transformer import init_params  # pylint: disable=g-import-not-at-top
  counts = []
  for critic in (False, True):
    shapes = jax.eval_shape(lambda c=critic: init_params(config, jax.random.PRNGKey(0), critic=c))
    counts.append(probe.param_count(shapes))
  return counts[0], counts[1]


def learner_state_bytes(p_actor: int, p_critic: int) -> int:
  """Device bytes of actor + critic with AdamW, at their larger step (see STATE_BYTES)."""
  return STATE_BYTES * (p_actor + p_critic) + STEP_BYTES * max(p_actor, p_critic)


def moe_layers_that_fit(capacity_bytes: float, state_fraction: float = 0.5, num_experts: int = 128,
                        max_layers: int = 48) -> tuple[int, dict]:
  """The most Qwen3-30B-A3B layers (of its 48, with `num_experts` experts each) whose actor + critic + AdamW state
  (`learner_state_bytes`) takes at most `state_fraction` of `capacity_bytes`, the rest left to activations and the
  MoE's temporaries. Counts are linear in the depth: measured abstractly at 1 and 2 layers, extrapolated.
  Returns (layers, the numbers behind it)."""
  one = role_param_counts(model_config(QWEN3_30B_A3B, num_layers=1, num_experts=num_experts))
  two = role_param_counts(model_config(QWEN3_30B_A3B, num_layers=2, num_experts=num_experts))
  per_layer = two[0] - one[0]
  fixed = (one[0] - per_layer, one[1] - per_layer)  # embeddings, head / value head, final norm
  budget = state_fraction * capacity_bytes
  layers = 0
  while layers < max_layers and learner_state_bytes(fixed[0] + (layers + 1) * per_layer,
                                                    fixed[1] + (layers + 1) * per_layer) <= budget:
    layers += 1
  state = learner_state_bytes(fixed[0] + layers * per_layer, fixed[1] + layers * per_layer)
  return layers, {"num_experts": num_experts, "params_per_layer": per_layer, "actor_fixed_params": fixed[0],
                  "critic_fixed_params": fixed[1], "capacity_gb": round(capacity_bytes / GB, 1),
                  "state_fraction": state_fraction, "state_gb": round(state / GB, 1),
                  "bytes_per_param": f"{STATE_BYTES} (f32 params + AdamW m, v) for both roles + {STEP_BYTES} (f32 "
                                     f"grads + bf16 copy) for the larger"}


@dataclasses.dataclass(frozen=True)
class LearnerRow:
  batch: int
  seq_len: int
  updates: int  # the first compiles; the rest are timed apart


def synthetic_trajectories(rng, batch: int, seq_len: int, vocab: int) -> list:
  """`experiments.bench.synthetic`'s batch (imported in the row's own process: the parent stays light)."""
  from experiments.bench import synthetic  # pylint: disable=g-import-not-at-top
  return synthetic.synthetic_trajectories(rng, batch, seq_len, vocab)


def make_learner(config, seq_len: int, device: Any) -> tuple[Any, float]:
  """`bench_train.py`'s one-device SAO learner (mesh 1×1×1, no critic warmup, one bucket = `seq_len`) on `device`,
  its parameters ready. Returns (learner, seconds to initialise the actor's parameters)."""
  import jax  # pylint: disable=g-import-not-at-top
  from sao.models.transformer import init_params  # pylint: disable=g-import-not-at-top
  from sao.train import config as config_lib  # pylint: disable=g-import-not-at-top
  from sao.train.learner import Learner  # pylint: disable=g-import-not-at-top
  from sao.train.mesh import make_mesh  # pylint: disable=g-import-not-at-top
  learner_config = config_lib.default_learner_config()
  learner_config.sao.critic_warmup_steps = 0
  learner_config.mesh.update(data=1, fsdp=1, tensor=1)
  learner_config.batching.bucket_lengths = (seq_len,)
  start = time.perf_counter()
  actor_params = jax.block_until_ready(init_params(config, jax.random.PRNGKey(0)))
  init_s = time.perf_counter() - start
  learner = Learner(learner_config, config, actor_params, mesh=make_mesh({"data": 1, "fsdp": 1, "tensor": 1},
                                                                         [device]))
  jax.block_until_ready(learner.critic_params)
  return learner, init_s


def learner_row(record: probe.Recorder, device: Any, compiles: probe.CompileLog, config, row: LearnerRow,
                peak_flops: float) -> None:
  """One-device SAO learner (`bench_train.py`'s setup: mesh 1×1×1, no critic warmup, one bucket = T) on synthetic
  trajectories: parameter init, each update's wall time and compiles, memory, tokens/s and FLOP/s vs the peak."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from sao.train import targets  # pylint: disable=g-import-not-at-top
  compiles.during = "params"
  start = time.perf_counter()
  learner, init_s = make_learner(config, row.seq_len, device)
  learner_config = learner.config
  p_actor, p_critic = probe.param_count(learner.actor_params), probe.param_count(learner.critic_params)
  a_actor = probe.active_params(learner.actor_params, config.num_experts, config.num_experts_per_tok)
  a_critic = probe.active_params(learner.critic_params, config.num_experts, config.num_experts_per_tok)
  record("params", actor_init_s=round(init_s, 3), learner_init_s=round(time.perf_counter() - start, 3),
         actor_params=p_actor, critic_params=p_critic, actor_active_params=int(a_actor),
         critic_active_params=int(a_critic), **probe.peak_memory(device))
  compiles.take()
  tokens = row.batch * row.seq_len
  epochs = learner_config.sao.critic_epochs
  forwards = 2 if targets.critic_reads_values_before(learner_config) else 1
  flops = probe.update_flops(a_actor, a_critic, tokens, epochs, forwards)
  rng = np.random.default_rng(0)
  walls = []
  for i in range(row.updates):
    trajectories = synthetic_trajectories(rng, row.batch, row.seq_len, config.vocab_size)
    compiles.during = f"update {i}"
    if i == 0:
      record("update_begin", index=i, tokens=tokens)  # a row stopped in its first update shows it got this far
    start = time.perf_counter()
    metrics = learner.update(trajectories)  # host floats: the update has finished
    wall = time.perf_counter() - start
    new = compiles.take()
    if not new:
      walls.append(wall)
    record("update", index=i, wall_s=round(wall, 4), compiled_programs=len(new),
           compile_s=round(sum(s for _, s, _ in new), 3), cache_hits=sum(h for _, _, h in new), tokens=tokens,
           tokens_per_s=round(tokens / wall, 1), flops=flops, flops_per_s=flops / wall,
           ratio_to_peak=round(flops / wall / peak_flops, 4), finite=all(np.isfinite(v) for v in metrics.values()),
           **probe.peak_memory(device))
  if walls:
    wall = float(np.median(walls))
    record("summary", batch=row.batch, seq_len=row.seq_len, timed_updates=len(walls), median_update_s=round(wall, 6),
           tokens_per_s=round(tokens / wall, 1), flops_per_s=flops / wall, peak_flops_per_s=peak_flops,
           ratio_to_peak=round(flops / wall / peak_flops, 4), critic_epochs=epochs, critic_forwards=forwards,
           flop_convention="6·P_actor·N + K·6·P_critic·N + F·2·P_critic·N, P active params (accelerator_probe)")


def decode_row(record: probe.Recorder, device: Any, compiles: probe.CompileLog, config, batch: int, prompt: int,
               new_tokens: int, repeats: int) -> None:
  """The local engine's program (`sao.models.sampling.Sampler.generate`: prefill, then a while loop of one-token
  steps) at `batch` rows of `prompt` tokens. One executable, two runs: every row stopping after 1 token (prefill + one
  step) and after `new_tokens` (prefill + `new_tokens` steps); a decode step = their difference / (new_tokens − 1),
  the prefill = the first minus one step. Median of `repeats` each."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from sao.models.sampling import Sampler, SamplingParams  # pylint: disable=g-import-not-at-top
  from sao.models.transformer import init_params  # pylint: disable=g-import-not-at-top
  compiles.during = "params"
  start = time.perf_counter()
  params = jax.block_until_ready(init_params(config, jax.random.PRNGKey(0)))
  record("params", init_s=round(time.perf_counter() - start, 3), params=probe.param_count(params),
         param_dtype=config.param_dtype, **probe.peak_memory(device))
  sampler = Sampler(config, params, batch_buckets=(batch,), prompt_buckets=(prompt,), new_token_buckets=(new_tokens,))
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, config.vocab_size, prompt) for _ in range(batch)]
  times = {}
  for n in (1, new_tokens):
    sampling = SamplingParams(max_new_tokens=n, temperature=1.0)
    compiles.during = f"generate {n} token(s)"
    start = time.perf_counter()
    sampler.generate(prompts, sampling, seed=0)  # the first call compiles (once: both share the executable)
    first = time.perf_counter() - start
    runs = []
    for i in range(repeats):
      start = time.perf_counter()
      out = sampler.generate(prompts, sampling, seed=i + 1)  # numpy out: the call has finished
      runs.append(time.perf_counter() - start)
    times[n] = float(np.median(runs))
    record("generate", new_tokens=n, first_call_s=round(first, 3), median_s=round(times[n], 4),
           generated=int(sum(len(c.token_ids) for c in out)), **probe.peak_memory(device))
  step = max(times[new_tokens] - times[1], 0.0) / max(new_tokens - 1, 1)
  prefill = max(times[1] - step, 1e-9)
  record("summary", batch=batch, prompt=prompt, new_tokens=new_tokens, prefill_s=round(prefill, 4),
         prefill_tokens_per_s=round(batch * prompt / prefill, 1), decode_step_s=round(step, 6),
         decode_tokens_per_s=round(batch / step, 1) if step > 0 else None, param_dtype=config.param_dtype,
         compute_dtype=config.dtype)


def main_job_row(record: probe.Recorder, repo: str, config_arg: str, workdir: str, limit_s: float) -> bool:
  """`experiments/train.py --config=<config_arg> --workdir=<workdir>` as a user runs it (its own environment,
  nothing set), its progress lines recorded with their times; stopped (its process group) at `limit_s`. Returns
  whether it finished by itself with status 0."""
  command = [sys.executable, "-u", os.path.join(repo, "experiments", "train.py"), f"--config={config_arg}",
             f"--workdir={workdir}"]
  record("command", argv=" ".join(command[1:]), limit_s=limit_s)
  start = time.perf_counter()
  counts = {"rl_steps": 0, "lines": 0}

  def on_line(line: str) -> None:
    counts["lines"] += 1
    if line.startswith(PROGRESS_PREFIXES):
      counts["rl_steps"] += line.startswith("[rl] step")
      record("line", elapsed_s=round(time.perf_counter() - start, 2), text=line[:400])
    else:
      print(f"  | {line}", flush=True)

  returncode, timed_out = probe.run_streaming(command, limit_s, on_line, cwd=repo)
  record("summary", returncode=returncode, timed_out=timed_out, rl_steps=counts["rl_steps"],
         output_lines=counts["lines"], wall_s=round(time.perf_counter() - start, 2))
  return returncode == 0 and not timed_out


# The main job's progress lines (`launch.run`): recorded one by one; everything else it prints is shown only.
PROGRESS_PREFIXES = ("[sft]", "[rl]", "[value_pretrain]", "[done]", "[embedded]", "[value pretraining]")
