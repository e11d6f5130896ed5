"""Rollout throughput: concurrent agent loops against one local JAX engine, dynamic batching on vs off.

  python experiments/bench_rollout.py [--concurrency=1,8,32,128] [--max_turns=4] [--max_new_tokens=16]

number_search tasks, a tiny random qwen3 (1 layer, hidden 32) with the toy tokenizer, one engine subprocess per mode
(batching on: `max_batch_size` = the largest concurrency; off: `max_batch_size=1`). Every shape bucket is compiled
before timing (a warm-up request per batch × prompt bucket) and the client is warmed up by one untimed run, so the
numbers are steady-state. For each concurrency c
it runs max(c, --min_episodes) episodes with at most c in flight and reports episodes/s and generated (action)
tokens/s over the wall-clock time. Prints one markdown table; `--output` also writes it as JSON.
"""
from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time

from absl import app, flags

from sao.engines.local_server import start_local_engine
from sao.engines.sglang_client import SGLangEngine
from sao.models.config import ModelConfig
from sao.models.sampling import SamplingParams
from sao.rollout import envs
from sao.rollout.agent import EpisodeLimits, run_episodes

_CONCURRENCY = flags.DEFINE_list("concurrency", ["1", "8", "32", "128"], "Concurrent agent loops to measure.")
_MIN_EPISODES = flags.DEFINE_integer("min_episodes", 16, "Episodes per measurement at least.")
_MAX_TURNS = flags.DEFINE_integer("max_turns", 4, "Model turns per episode.")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 16, "Tokens per model turn.")
_BATCH_WINDOW_MS = flags.DEFINE_float("batch_window_ms", 5.0, "Engine batching window.")
_OUTPUT = flags.DEFINE_string("output", None, "Optional JSON file for the results.")

PROMPT_BUCKETS = (256, 512)


def save_model(directory: str) -> None:
  """A random tiny qwen3 sized to the toy tokenizer, saved with the tokenizer as one HF directory."""
  import jax  # the bench process itself runs no model; keep its JAX use to this one init

  from sao.models.hf import save_pretrained
  from sao.models.tokenizer import toy_tokenizer
  from sao.models.transformer import init_params
  tokenizer = toy_tokenizer()
  config = ModelConfig.tiny("qwen3", vocab_size=tokenizer.vocab_size, num_layers=1, hidden_size=32,
                            intermediate_size=64, num_heads=2, num_kv_heads=1, head_dim=16,
                            max_position_embeddings=512)
  save_pretrained(config, init_params(config, jax.random.PRNGKey(0)), directory)
  tokenizer.save_pretrained(directory)


def batch_buckets(max_batch: int) -> tuple[int, ...]:
  return tuple(b for b in (1, 8, 32, 128) if b < max_batch) + (max_batch,)


async def warm_up(engine: SGLangEngine, buckets: tuple[int, ...], max_new_tokens: int) -> None:
  """Compiles every (batch, prompt) bucket: rows of one batch request are batched together by the engine."""
  for b in buckets:
    for p in PROMPT_BUCKETS:
      await engine.generate_batch([[7] * (p - max_new_tokens - 1)] * b,
                                  {"max_new_tokens": max_new_tokens, "temperature": 1.0})


async def measure(url: str, concurrency: int, tokenizer, limits: EpisodeLimits,
                  sampling: SamplingParams) -> dict[str, float]:
  n = max(concurrency, _MIN_EPISODES.value)
  tasks = envs.make("number_search").tasks("train", n, seed=concurrency)
  async with SGLangEngine(url, timeout_s=600) as engine:
    before = (await engine.get_model_info())["stats"]
    start = time.monotonic()
    trajs = await run_episodes(engine, tokenizer, "number_search", tasks, sampling, limits, concurrency)
    wall = time.monotonic() - start
    after = (await engine.get_model_info())["stats"]
  bad = [t.status for t in trajs if not t.is_trainable]
  if bad:
    raise RuntimeError(f"{len(bad)} episodes failed: {bad[:5]}")
  batches = after["batches"] - before["batches"]
  return {"episodes": n, "wall_s": wall, "episodes_per_s": n / wall,
          "tokens_per_s": sum(t.num_action_tokens for t in trajs) / wall,
          "rows_per_batch": (after["rows"] - before["rows"]) / max(batches, 1)}


def main(argv: list[str]) -> None:
  del argv
  from sao.models.tokenizer import toy_tokenizer
  levels = [int(c) for c in _CONCURRENCY.value]
  tokenizer = toy_tokenizer()
  limits = EpisodeLimits(max_turns=_MAX_TURNS.value, max_total_tokens=500, timeout_s=600)
  sampling = SamplingParams(max_new_tokens=_MAX_NEW_TOKENS.value, temperature=1.0)
  workdir = tempfile.mkdtemp(prefix="bench_rollout_")
  model_dir = os.path.join(workdir, "model")
  save_model(model_dir)
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  results = []
  for mode, max_batch in (("on", max(levels)), ("off", 1)):
    buckets = batch_buckets(max_batch)
    args = [f"--max_batch_size={max_batch}", f"--batch_window_ms={_BATCH_WINDOW_MS.value}",
            f"--batch_buckets={','.join(map(str, buckets))}", f"--prompt_buckets={','.join(map(str, PROMPT_BUCKETS))}",
            f"--new_token_buckets={_MAX_NEW_TOKENS.value}", f"--compilation_cache_dir={workdir}/jax_cache"]
    proc, url = start_local_engine(model_dir, engine_args=args, env=env, startup_timeout_s=600)
    try:
      async def warm():
        async with SGLangEngine(url, timeout_s=600) as engine:
          await warm_up(engine, buckets, _MAX_NEW_TOKENS.value)
      start = time.monotonic()
      asyncio.run(warm())
      print(f"batching {mode}: compiled {len(buckets) * len(PROMPT_BUCKETS)} buckets in "
            f"{time.monotonic() - start:.1f}s", flush=True)
      asyncio.run(measure(url, 1, tokenizer, limits, sampling))  # client warm-up (templates, connections)
      for c in levels:
        row = {"batching": mode, "concurrency": c, **asyncio.run(measure(url, c, tokenizer, limits, sampling))}
        print(json.dumps(row), flush=True)
        results.append(row)
    finally:
      proc.stop()
  print(f"\nnumber_search, tiny random qwen3 (1 layer, hidden 32), {_MAX_TURNS.value} turns × "
        f"{_MAX_NEW_TOKENS.value} new tokens, CPU ({os.cpu_count()} cores)\n")
  print("| batching | concurrent loops | episodes | wall s | episodes/s | generated tokens/s | rows/batch |")
  print("|---|---:|---:|---:|---:|---:|---:|")
  for r in results:
    print(f"| {r['batching']} | {r['concurrency']} | {r['episodes']} | {r['wall_s']:.1f} | "
          f"{r['episodes_per_s']:.2f} | {r['tokens_per_s']:.0f} | {r['rows_per_batch']:.1f} |")
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump(results, f, indent=2)


if __name__ == "__main__":
  app.run(main)
