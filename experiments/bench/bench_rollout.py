"""Rollout throughput: concurrent agent loops against local JAX engines, dynamic batching and the prefix cache
across turns each on vs off.

  python experiments/bench/bench_rollout.py [--concurrency=8,32,128] [--modes=batch+cache,batch,cache,none]
      [--repeats=2] [--max_turns=4] [--max_new_tokens=16]
  python experiments/bench/bench_rollout.py --sampler_only  # one Sampler call, a turn with vs without its cached prefix

number_search tasks, a tiny random qwen3 (1 layer, hidden 32) with the toy tokenizer, one engine subprocess per mode,
all started before timing (batching on: `max_batch_size` = the largest concurrency; off: `max_batch_size=1`; cache
off: `--prefix_cache_bytes=0`). Every engine is warmed up first (a request per batch × prompt bucket, then one
untimed pass of every concurrency, which compiles the prefix/suffix buckets the cache uses), so the numbers are
steady-state. Then, for each concurrency c, the modes are measured interleaved, `--repeats` rounds (A B C D A B C D):
on a shared machine each mode sees the same load drift. A measurement runs max(c, --min_episodes) episodes with at
most c in flight and reports episodes/s, generated tokens/s, prompt tokens and prefilled (not cached) prompt tokens
per episode, rows per batch, and the 1-minute load average (`os.getloadavg`) before it. Prints one markdown table
(means over repeats, with each repeat's episodes/s); `--output` also writes every measurement as JSON.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time

from absl import app, flags

# the repository, two folders up: this checkout's `sao`
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from sao.engines.local_server import start_local_engine
from sao.engines.sglang_client import SGLangEngine
from sao.models.config import ModelConfig
from sao.models.sampling import SamplingParams
from sao.rollout import envs
from sao.rollout.agent import EpisodeLimits, run_episodes


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import: tests import every command in one process, and
  commands share flag names, e.g. `--config`, `--out`, `--batch`)."""
  global _CONCURRENCY, _MODES, _REPEATS, _MIN_EPISODES, _MAX_TURNS  # pylint: disable=global-statement
  global _MAX_NEW_TOKENS, _BATCH_WINDOW_MS, _OUTPUT, _SAMPLER_ONLY  # pylint: disable=global-statement
  _CONCURRENCY = flags.DEFINE_list("concurrency", ["8", "32", "128"], "Concurrent agent loops to measure.")
  _MODES = flags.DEFINE_list("modes", ["batch+cache", "batch", "cache", "none"],
                             "Engine modes: 'batch' = dynamic batching on, 'cache' = prefix cache on.")
  _REPEATS = flags.DEFINE_integer("repeats", 2, "Interleaved rounds per concurrency.")
  _MIN_EPISODES = flags.DEFINE_integer("min_episodes", 16, "Episodes per measurement at least.")
  _MAX_TURNS = flags.DEFINE_integer("max_turns", 4, "Model turns per episode.")
  _MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 16, "Tokens per model turn.")
  _BATCH_WINDOW_MS = flags.DEFINE_float("batch_window_ms", 5.0, "Engine batching window.")
  _OUTPUT = flags.DEFINE_string("output", None, "Optional JSON file for the results.")
  _SAMPLER_ONLY = flags.DEFINE_bool("sampler_only", False, "Instead: time one Sampler call in this process, a turn "
                                    "with vs without its cached prefix (no HTTP, no agent loop).")


PROMPT_BUCKETS = (256, 512)
SUFFIX_BUCKETS = (64, 256, 512)  # a later turn prefills only its new tokens (an observation: tens of tokens)
MODES = ("batch+cache", "batch", "cache", "none")


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


def engine_args(mode: str, max_batch: int, workdir: str) -> list[str]:
  """The engine flags of a mode ('batch' and/or 'cache' in its name turn those on)."""
  batch = max_batch if "batch" in mode else 1
  args = [f"--max_batch_size={batch}", f"--batch_window_ms={_BATCH_WINDOW_MS.value}",
          f"--batch_buckets={','.join(map(str, batch_buckets(batch)))}",
          f"--prompt_buckets={','.join(map(str, PROMPT_BUCKETS))}",
          f"--suffix_buckets={','.join(map(str, SUFFIX_BUCKETS))}",
          f"--new_token_buckets={_MAX_NEW_TOKENS.value}", f"--compilation_cache_dir={workdir}/jax_cache"]
  return args + ([] if "cache" in mode else ["--prefix_cache_bytes=0"])


async def warm_up(engine: SGLangEngine, buckets: tuple[int, ...], max_new_tokens: int) -> None:
  """Compiles every (batch, prompt) bucket: rows of one batch request are batched together by the engine."""
  for b in buckets:
    for p in PROMPT_BUCKETS:
      await engine.generate_batch([[7] * (p - max_new_tokens - 1)] * b,
                                  {"max_new_tokens": max_new_tokens, "temperature": 1.0})


async def measure(url: str, concurrency: int, tokenizer, limits: EpisodeLimits, sampling: SamplingParams,
                  seed: int) -> dict[str, float]:
  n = max(concurrency, _MIN_EPISODES.value)
  tasks = envs.make("number_search").tasks("train", n, seed=seed)
  load = os.getloadavg()[0]
  async with SGLangEngine(url, timeout_s=1200) as engine:
    before = (await engine.get_model_info())["stats"]
    start = time.monotonic()
    trajs = await run_episodes(engine, tokenizer, "number_search", tasks, sampling, limits, concurrency)
    wall = time.monotonic() - start
    after = (await engine.get_model_info())["stats"]
  bad = [t.status for t in trajs if not t.is_trainable]
  if bad:
    raise RuntimeError(f"{len(bad)} episodes failed: {bad[:5]}")
  delta = {k: after[k] - before[k] for k in ("batches", "rows", "prompt_tokens", "cached_prompt_tokens")}
  return {"episodes": n, "wall_s": wall, "episodes_per_s": n / wall, "load_1min": load,
          "tokens_per_s": sum(t.num_action_tokens for t in trajs) / wall,
          "rows_per_batch": delta["rows"] / max(delta["batches"], 1),
          "prompt_tokens_per_episode": delta["prompt_tokens"] / n,
          "prefill_tokens_per_episode": (delta["prompt_tokens"] - delta["cached_prompt_tokens"]) / n}


def sampler_only() -> None:
  """Min / median of 15 calls: a second turn (prefix of L tokens + completion + 20 new tokens), uncached
  (`generate`) vs continuing from the first turn's state (`generate_continuing`), B rows, the engine's buckets."""
  import jax
  import numpy as np

  from sao.models.sampling import Sampler
  from sao.models.transformer import init_params
  config = ModelConfig.tiny("qwen3", vocab_size=300, num_layers=1, hidden_size=32, intermediate_size=64,
                            num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=512)
  sampler = Sampler(config, init_params(config, jax.random.PRNGKey(0)), prompt_buckets=PROMPT_BUCKETS,
                    batch_buckets=(1, 8, 32), new_token_buckets=(_MAX_NEW_TOKENS.value,),
                    suffix_buckets=SUFFIX_BUCKETS)
  sp = SamplingParams(max_new_tokens=_MAX_NEW_TOKENS.value, temperature=1.0)
  rng = np.random.default_rng(0)
  print("| rows | prefix tokens | uncached ms (min / median) | cached ms (min / median) |\n|---:|---:|---|---|")
  for rows, length in ((1, 100), (1, 220), (8, 100), (8, 220), (32, 100), (32, 220)):
    first = [rng.integers(0, config.vocab_size, length) for _ in range(rows)]
    done, states = sampler.generate_continuing(first, sp, [None] * rows)
    prompts = [np.r_[p, c.token_ids, rng.integers(0, config.vocab_size, 20)] for p, c in zip(first, done)]
    cells = []
    for call in (lambda: sampler.generate(prompts, sp, 1), lambda: sampler.generate_continuing(prompts, sp, states, 1)):
      call()  # compiles
      times = []
      for _ in range(15):
        start = time.perf_counter()
        call()
        times.append(1e3 * (time.perf_counter() - start))
      cells.append(f"{min(times):.1f} / {sorted(times)[7]:.1f}")
    print(f"| {rows} | {length} | {cells[0]} | {cells[1]} |", flush=True)


def main(argv: list[str]) -> None:
  del argv
  if _SAMPLER_ONLY.value:
    return sampler_only()
  from sao.models.tokenizer import toy_tokenizer
  levels = [int(c) for c in _CONCURRENCY.value]
  modes = list(_MODES.value)
  if not modes or any(m not in MODES for m in modes):
    raise app.UsageError(f"--modes: each of {MODES}, got {modes}")
  tokenizer = toy_tokenizer()
  limits = EpisodeLimits(max_turns=_MAX_TURNS.value, max_total_tokens=500, timeout_s=1200)
  sampling = SamplingParams(max_new_tokens=_MAX_NEW_TOKENS.value, temperature=1.0)
  workdir = tempfile.mkdtemp(prefix="bench_rollout_")
  model_dir = os.path.join(workdir, "model")
  save_model(model_dir)
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  procs, urls = [], {}
  try:
    for mode in modes:
      proc, url = start_local_engine(model_dir, engine_args=engine_args(mode, max(levels), workdir), env=env,
                                     startup_timeout_s=600)
      procs.append(proc)
      urls[mode] = url

      async def warm():
        async with SGLangEngine(url, timeout_s=1200) as engine:
          await warm_up(engine, batch_buckets(max(levels) if "batch" in mode else 1), _MAX_NEW_TOKENS.value)
      start = time.monotonic()
      asyncio.run(warm())
      for c in [1] + levels:  # untimed: the client, and the cache's prefix/suffix buckets at every batch size
        asyncio.run(measure(url, c, tokenizer, limits, sampling, seed=10_000 + c))
      print(f"{mode}: warmed up in {time.monotonic() - start:.1f}s", flush=True)
    results = []
    for c in levels:
      for r in range(_REPEATS.value):
        for mode in modes:  # interleaved: A B C D, A B C D
          row = {"mode": mode, "concurrency": c, "repeat": r,
                 **asyncio.run(measure(urls[mode], c, tokenizer, limits, sampling, seed=c))}
          print(json.dumps(row), flush=True)
          results.append(row)
  finally:
    for proc in procs:
      proc.stop()
  print(f"\nnumber_search, tiny random qwen3 (1 layer, hidden 32), {_MAX_TURNS.value} turns × "
        f"{_MAX_NEW_TOKENS.value} new tokens, CPU ({os.cpu_count()} cores), {_REPEATS.value} interleaved repeats\n")
  print("| mode | loops | episodes/s (mean) | each repeat | prompt tok/ep | prefilled tok/ep | rows/batch | load |")
  print("|---|---:|---:|---|---:|---:|---:|---|")
  for c in levels:
    for mode in modes:
      rows = [r for r in results if r["mode"] == mode and r["concurrency"] == c]
      mean = lambda k: sum(r[k] for r in rows) / len(rows)
      each = " / ".join(f"{r['episodes_per_s']:.2f}" for r in rows)
      loads = " / ".join(f"{r['load_1min']:.1f}" for r in rows)
      print(f"| {mode} | {c} | {mean('episodes_per_s'):.2f} | {each} | {mean('prompt_tokens_per_episode'):.0f} | "
            f"{mean('prefill_tokens_per_episode'):.0f} | {mean('rows_per_batch'):.1f} | {loads} |")
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump(results, f, indent=2)


if __name__ == "__main__":
  define_flags()
  app.run(main)
