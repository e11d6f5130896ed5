"""The local engine's prefix cache across turns: the index's hit rules, bounds and invalidation (`PrefixCache`, no
model), and in-process `LocalEngine`s with the cache on vs off (a tiny qwen3 and a tiny hybrid qwen3_5): equal
tokens and log-probs over multi-turn conversations, greedy and sampled.

Tolerance: a cached token's keys/values (and the hybrid's recurrent state) were computed by the step that first
saw it (a prefill chunk or a decode step), an uncached request recomputes them in one prefill; both are float32 sums
in a different order, so log-probs agree to float32 rounding (atol 1e-5 here; the observed difference is ~5e-7), and
sampled tokens are equal whenever the seeds are (the engines process the same batches in the same order).
"""
from __future__ import annotations

import asyncio
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao.engines.local_engine import EngineConfig, LocalEngine
from sao.engines.prefix_cache import PrefixCache
from sao.models.config import ModelConfig
from sao.models.hf import load_pretrained, save_pretrained
from sao.models.sampling import Sampler, SamplingParams, _generate_continuing
from sao.models.transformer import abstract_params

# float32: the cached path prefills the suffix on top of a saved state, the uncached one the whole prompt, so sums run
# in another order; a log-prob of −4 then differs by up to ~1.4e-5 (qwen3_5_text, after the HF weight layout moved
# the contractions): an absolute 1e-5 plus 1e-5 relative.
ATOL = 1e-5
RTOL = 1e-5
# Few shapes: prompts <= 64 tokens, one batch bucket, one new-token bucket → 3 programs per model (uncached; cached
# with prefix bucket 0 and 64).
CONFIG = dict(prompt_buckets=(64,), suffix_buckets=(64,), batch_buckets=(8,), new_token_buckets=(8,),
              batch_window_ms=20.0, max_batch_size=8)
GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)
SAMPLED = SamplingParams(max_new_tokens=8, temperature=0.9, top_p=0.95)


@dataclasses.dataclass(frozen=True)
class FakeState:
  length: int
  nbytes: int = 100


# ---- the index (no model) ------------------------------------------------------------------------------------------

def test_full_attention_hit_reuses_the_longest_common_prefix_and_keeps_the_last_token():
  cache = PrefixCache(10_000, truncatable=True, version="v", block_size=4)
  a = np.arange(20)
  assert cache.insert(a, FakeState(20), "v")
  assert cache.lookup(a[:3], "v") is None  # shorter than a block
  assert cache.lookup(np.r_[a, 99], "v").length == 20  # extends the entry
  assert cache.lookup(a, "v").length == 19  # the same tokens: the last one is prefilled
  assert cache.lookup(np.r_[a[:9], 77, a[10:]], "v").length == 9  # diverges mid-prefix: partial reuse
  assert cache.lookup(np.r_[a[:3], 77, a[4:]], "v") is None  # diverges inside the first block
  assert cache.lookup(np.r_[a, 99], "other version") is None


def test_recurrent_state_hits_only_its_exact_prefix():
  cache = PrefixCache(10_000, truncatable=False, version="v", block_size=4)
  a = np.arange(20)
  cache.insert(a, FakeState(20), "v")
  cache.insert(a[:8], FakeState(8), "v")
  assert cache.lookup(np.r_[a, 5], "v").length == 20
  assert cache.lookup(a, "v").length == 8  # the 20-token state would leave nothing to prefill
  assert cache.lookup(np.r_[a[:12], 1, 2], "v").length == 8  # diverges after 12 tokens: the 8-token entry
  assert cache.lookup(np.r_[a[:7], 1, 2], "v") is None


@pytest.mark.parametrize("truncatable", [True, False])
def test_many_conversations_sharing_a_system_prompt_each_find_their_own(truncatable):
  cache = PrefixCache(10**6, truncatable=truncatable, version="v", block_size=4)
  system = np.arange(9)  # shared by all: two full blocks and a partial one
  convs = [np.r_[system, 100 + i, np.arange(10) + 7 * i] for i in range(30)]
  for conv in convs:
    cache.insert(conv, FakeState(conv.size), "v")
  for i, conv in enumerate(convs):  # the oldest too: beyond the shared blocks only its own entry matches
    hit = cache.lookup(np.r_[conv, 1, 2], "v")
    assert hit.length == conv.size and hit.state.length == conv.size, i
  hit = cache.lookup(np.r_[system, 999, 1, 2, 3, 4], "v")  # a new conversation: only the system prompt is shared
  assert (hit is not None and hit.length == 9) if truncatable else hit is None


def test_clear_on_a_new_version_and_stale_inserts_are_ignored():
  cache = PrefixCache(10_000, truncatable=True, version="1:v", block_size=4)
  a = np.arange(10)
  assert cache.insert(a, FakeState(10), "1:v")
  cache.clear("2:v")
  assert len(cache) == 0 and cache.nbytes == 0
  assert cache.lookup(np.r_[a, 1], "1:v") is None and cache.lookup(np.r_[a, 1], "2:v") is None
  assert not cache.insert(a, FakeState(10), "1:v")  # a batch of the old weights may not store its state
  assert cache.insert(a, FakeState(10), "2:v") and cache.lookup(np.r_[a, 1], "2:v").length == 10


def test_eviction_keeps_the_byte_bound_least_recently_used_first():
  entry_bytes = 100 + 8 * 4  # state + int32 tokens
  cache = PrefixCache(3 * entry_bytes, truncatable=True, version="v", block_size=4)
  seqs = [np.arange(8) + 100 * i for i in range(5)]
  for s in seqs[:3]:
    cache.insert(s, FakeState(8), "v")
  assert cache.lookup(np.r_[seqs[0], 1], "v") is not None  # touch 0: 1 is now the least recently used
  for s in seqs[3:]:
    cache.insert(s, FakeState(8), "v")
    assert cache.nbytes <= cache.max_bytes
  assert len(cache) == 3 and cache.stats["evictions"] == 2
  assert cache.lookup(np.r_[seqs[1], 1], "v") is None and cache.lookup(np.r_[seqs[2], 1], "v") is None
  assert cache.lookup(np.r_[seqs[0], 1], "v") is not None
  assert not cache.insert(np.arange(8), FakeState(8, nbytes=10 * entry_bytes), "v")  # larger than the bound


def test_the_next_turn_replaces_the_entry_it_extends():
  cache = PrefixCache(10_000, truncatable=True, version="v", block_size=4)
  a = np.arange(10)
  cache.insert(a, FakeState(10), "v")
  hit = cache.lookup(np.r_[a, 1, 2], "v")
  cache.insert(np.r_[a, 1, 2, 3], FakeState(13), "v", replaces=hit.entry_id)
  assert len(cache) == 1 and cache.lookup(np.r_[a, 1, 2, 3, 4], "v").length == 13
  with pytest.raises(ValueError, match="covers 5 tokens"):
    cache.insert(a, FakeState(5), "v")
  with pytest.raises(ValueError, match="max_bytes"):
    PrefixCache(0, truncatable=True)


# ---- engines with and without the cache ----------------------------------------------------------------------------

@pytest.fixture(scope="module", params=["qwen3", "qwen3_5_text"])
def model(request, tmp_path_factory):
  """(model type, directory of weights A, directory of weights B)."""
  config = ModelConfig.tiny(request.param)
  dirs = []
  for seed in (0, 1):
    rng = np.random.default_rng(seed)  # numpy-filled (nothing to compile): std 0.3 weights, norm scales 1 ± 0.1

    def fill(path, leaf):
      noise = rng.standard_normal(leaf.shape).astype(np.float32)
      return jnp.asarray(1.0 + 0.1 * noise if "norm" in jax.tree_util.keystr(path) else 0.3 * noise, leaf.dtype)

    path = str(tmp_path_factory.mktemp(f"{request.param}_{seed}"))
    save_pretrained(config, jax.tree_util.tree_map_with_path(fill, abstract_params(config)), path)
    dirs.append(path)
  return request.param, *dirs


def run_engines(model_dir: str, fn, **overrides):
  """Runs `fn(cached_engine, uncached_engine)` in a fresh event loop with both engines started."""
  async def main():
    engines = [LocalEngine(model_dir, EngineConfig(**{**CONFIG, **overrides, "prefix_cache_bytes": b}))
               for b in (2**24, 0)]
    for e in engines:
      await e.start()
    try:
      return await fn(*engines)
    finally:
      for e in engines:
        await e.stop()
  return asyncio.run(main())


def observation(turn: int, conv: int) -> list[int]:
  """The tokens an environment appends after turn `turn` of conversation `conv` (fixed, so both engines see them)."""
  return [(7 * turn + 11 * conv + j) % 120 for j in range(5)]


async def conversation(engine: LocalEngine, conv: int, sp: SamplingParams, turns: int = 3):
  """Turns of one conversation: each prompt = the previous prompt + its completion + an observation."""
  rng = np.random.default_rng(conv)
  tokens = rng.integers(0, 120, 20).tolist()
  out = []
  for turn in range(turns):
    ((c, version),) = await engine.generate([(np.asarray(tokens), sp)])
    out.append((len(tokens), c, version))
    tokens += c.token_ids.tolist() + observation(turn, conv)
  return out


def assert_same(cached, uncached):
  for (n, a, _), (m, b, _) in zip(cached, uncached):
    assert n == m and a.token_ids.tolist() == b.token_ids.tolist() and a.finish_reason == b.finish_reason
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("sp", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_multi_turn_logprobs_equal_without_the_cache(model, sp):
  _, model_dir, _ = model

  async def fn(cached, uncached):
    return await conversation(cached, 0, sp), await conversation(uncached, 0, sp), cached.model_info()["stats"]

  with_cache, without, stats = run_engines(model_dir, fn)
  assert_same(with_cache, without)
  # Turns 2 and 3 continue from the previous turn's prompt + completion: only the observation is prefilled.
  assert [c.cached_tokens for _, c, _ in with_cache] == [0, 28, 41]
  assert stats["cached_prompt_tokens"] == 69 and stats["prefix_cache"]["entries"] == 1  # each turn replaced the last


def test_a_request_diverging_mid_prefix_is_still_correct(model):
  model_type, model_dir, _ = model

  async def fn(cached, uncached):
    first = await conversation(cached, 0, GREEDY, turns=1)
    prompt = np.asarray(np.random.default_rng(0).integers(0, 120, 20).tolist()[:18] + [3, 4, 5])
    results = []
    for engine in (cached, uncached):
      ((c, _),) = await engine.generate([(prompt, GREEDY)])
      results.append((prompt.size, c, "0"))
    return first, results

  _, (a, b) = run_engines(model_dir, fn)
  assert_same([a], [b])
  # The cached conversation shares 18 tokens with this prompt: full attention reuses them (cut to 18); the
  # recurrent state holds all 28 and cannot be cut: a miss.
  assert a[1].cached_tokens == (18 if model_type == "qwen3" else 0)


def test_a_new_weight_version_never_reuses_the_old_state(model):
  _, model_dir, other_dir = model

  async def fn(cached, uncached):
    await conversation(cached, 0, GREEDY, turns=1)
    for engine in (cached, uncached):
      await engine.update_weights(other_dir)
    assert cached.model_info()["stats"]["prefix_cache"]["entries"] == 0
    return await conversation(cached, 0, GREEDY, turns=2), await conversation(uncached, 0, GREEDY, turns=2)

  with_cache, without = run_engines(model_dir, fn)
  assert_same(with_cache, without)
  assert [c.cached_tokens for _, c, _ in with_cache] == [0, 28] and with_cache[0][2] == "1"


def test_flush_cache_drops_the_entries_and_the_next_turn_prefills_again(model):
  _, model_dir, _ = model

  async def fn(cached, uncached):
    await conversation(cached, 0, GREEDY, turns=1)
    entries = cached.model_info()["stats"]["prefix_cache"]["entries"]
    dropped = await cached.flush_cache(), await uncached.flush_cache()
    after = cached.model_info()["stats"]["prefix_cache"]["entries"]
    return entries, dropped, after, await conversation(cached, 0, GREEDY, turns=2), await conversation(
        uncached, 0, GREEDY, turns=2)

  entries, dropped, after, with_cache, without = run_engines(model_dir, fn)
  assert (entries, dropped, after) == (1, (1, 0), 0)
  assert_same(with_cache, without)
  # The flushed conversation's first turn is prefilled in full; its second continues from that turn's entry.
  assert [c.cached_tokens for _, c, _ in with_cache] == [0, 28]


def test_concurrent_conversations_are_batched_and_equal_uncached(model):
  _, model_dir, _ = model

  async def fn(cached, uncached):
    results = []
    for engine in (cached, uncached):
      results.append(await asyncio.gather(*(conversation(engine, conv, GREEDY) for conv in range(6))))
    return results, cached.model_info()["stats"]

  (with_cache, without), stats = run_engines(model_dir, fn)
  for a, b in zip(with_cache, without):
    assert_same(a, b)
  assert stats["max_rows_per_batch"] > 1 and stats["batches"] < stats["rows"]
  assert stats["cached_prompt_tokens"] == sum(c.cached_tokens for conv in with_cache for _, c, _ in conv) > 0


def test_prefix_lengths_are_bucketed_so_new_lengths_do_not_recompile(model):
  _, model_dir, _ = model
  config, params = load_pretrained(model_dir)  # the engines' config: their compiled programs are shared
  sampler = Sampler(config, params, prompt_buckets=CONFIG["prompt_buckets"], batch_buckets=CONFIG["batch_buckets"],
                    new_token_buckets=CONFIG["new_token_buckets"], suffix_buckets=CONFIG["suffix_buckets"])
  rng = np.random.default_rng(5)
  prompts = [rng.integers(0, 120, 40) for _ in range(2)]
  first, states = sampler.generate_continuing(prompts, GREEDY, [None, None])  # the no-prefix program
  prompts = [np.r_[p, c.token_ids, 9, 9, 9] for p, c in zip(prompts, first)]
  sampler.generate_continuing(prompts, GREEDY, states)
  compiled = _generate_continuing._cache_size()
  for cut in (16, 23, 37, 47):  # other prefix lengths, as full attention reuses them (hybrid: exact states only)
    prefixes = [s.truncated(cut) if s.truncatable else s for s in states]
    completions, _ = sampler.generate_continuing(prompts, GREEDY, prefixes)
    assert [c.cached_tokens for c in completions] == [s.length for s in prefixes]
  assert _generate_continuing._cache_size() == compiled
