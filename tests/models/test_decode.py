"""KV-cache decoding, sampling and token log-probs: cache == full forward, sampler log-probs == token_logprobs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao.models.config import ModelConfig
from sao.models.logprobs import token_logprobs
from sao.models.sampling import Sampler, SamplingParams, sample_tokens
from sao.models.transformer import CausalLM, init_cache
from tests.models.helpers import forward, padded_batch, random_params


@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_moe"])
def test_kv_cache_decode_equals_full_forward(model_type):
  config = ModelConfig.tiny(model_type)
  params = random_params(config)
  model = CausalLM(config)
  ids, mask = padded_batch(np.random.default_rng(0), config.vocab_size, [10, 6, 3], 10, left=True)
  full = forward(config, params, ids, mask)
  # Prefill the first 6 columns (row 2 is all padding there), then decode the rest one token at a time.
  cache = init_cache(config, batch_size=3, max_length=16)
  step = jax.jit(lambda p, i, m, c: model.apply({"params": p}, i, m, c))
  logits, cache = step(params, ids[:, :6], mask[:, :6], cache)
  chunks = [logits]
  for t in range(6, 10):
    logits, cache = step(params, ids[:, t:t + 1], mask[:, t:t + 1], cache)
    chunks.append(logits)
  cached = np.concatenate([np.asarray(c) for c in chunks], axis=1)
  real = mask.astype(bool)
  assert np.abs(cached[real] - np.asarray(full)[real]).max() <= 1e-5
  assert np.asarray(cache["index"]).tolist() == [10, 10, 10]


def _scored(config, params, prompts, completions, temperature):
  """token_logprobs of prompt + completion, left-padded; returns per-row log-probs of the completion tokens."""
  seqs = [np.concatenate([p, c.token_ids]) for p, c in zip(prompts, completions)]
  total = max(len(s) for s in seqs)
  ids = np.zeros((len(seqs), total), np.int32)
  mask = np.zeros_like(ids)
  for i, s in enumerate(seqs):
    ids[i, total - len(s):] = s
    mask[i, total - len(s):] = 1
  lp = np.asarray(jax.jit(token_logprobs, static_argnames=("config", "chunk_size"))(
      params, config, ids, mask, temperature, chunk_size=4))
  return [lp[i, total - len(c.token_ids):] for i, c in enumerate(completions)], ids, mask


@pytest.mark.parametrize("model_type", ["llama", "qwen3_moe"])
def test_sampler_logprobs_equal_token_logprobs(model_type):
  config = ModelConfig.tiny(model_type, tie_word_embeddings=model_type == "llama")
  params = random_params(config, seed=2)
  rng = np.random.default_rng(1)
  prompts = [rng.integers(0, config.vocab_size, n) for n in (5, 11, 2)]
  sp = SamplingParams(max_new_tokens=12, temperature=0.7, top_p=0.9, top_k=20)
  completions = Sampler(config, params).generate(prompts, sp, seed=3)
  assert [len(c.token_ids) for c in completions] == [12, 12, 12]
  assert all(c.finish_reason == "length" for c in completions)
  scored, _, _ = _scored(config, params, prompts, completions, 0.7)
  for c, want in zip(completions, scored):
    np.testing.assert_allclose(c.logprobs, want, atol=1e-5, rtol=0)


def test_greedy_is_deterministic_argmax_and_top_k_1_matches():
  config = ModelConfig.tiny("qwen3")
  params = random_params(config, seed=4)
  sampler = Sampler(config, params, batch_buckets=(4,))  # one compiled program shared with the next test
  rng = np.random.default_rng(2)
  prompts = [rng.integers(0, config.vocab_size, n) for n in (7, 3)]
  greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
  a = sampler.generate(prompts, greedy, seed=0)
  b = sampler.generate(prompts, greedy, seed=123)
  top1 = sampler.generate(prompts, SamplingParams(max_new_tokens=8, temperature=1.0, top_k=1), seed=7)
  for x, y, z in zip(a, b, top1):
    np.testing.assert_array_equal(x.token_ids, y.token_ids)
    np.testing.assert_array_equal(x.token_ids, z.token_ids)
  # Teacher-forced full forward: every greedy token is the argmax at its position; log-probs are temperature 1.
  scored, ids, mask = _scored(config, params, prompts, a, 1.0)
  logits = forward(config, params, ids, mask)
  for i, c in enumerate(a):
    n = len(c.token_ids)
    np.testing.assert_array_equal(np.argmax(np.asarray(logits)[i, -n - 1:-1], axis=-1), c.token_ids)
    np.testing.assert_allclose(c.logprobs, scored[i], atol=1e-5, rtol=0)


def test_stop_tokens_and_per_row_limits():
  config = ModelConfig.tiny("qwen3")
  params = random_params(config, seed=5)
  sampler = Sampler(config, params, batch_buckets=(4,))
  prompt = np.arange(5)
  first = sampler.generate([prompt], SamplingParams(max_new_tokens=4, temperature=0.0))[0]
  out = sampler.generate(
      [prompt, prompt, prompt],
      [SamplingParams(max_new_tokens=4, temperature=0.0, stop_token_ids=(int(first.token_ids[1]),)),
       SamplingParams(max_new_tokens=2, temperature=0.0),
       SamplingParams(max_new_tokens=4, temperature=0.0)])
  assert out[0].finish_reason == "stop" and out[0].token_ids.tolist() == first.token_ids[:2].tolist()
  assert out[1].finish_reason == "length" and out[1].token_ids.tolist() == first.token_ids[:2].tolist()
  assert out[2].finish_reason == "length" and out[2].token_ids.tolist() == first.token_ids.tolist()
  with pytest.raises(ValueError, match=r"prompts\[0\]"):
    sampler.generate([[config.vocab_size]])


def test_top_p_top_k_truncation_support():
  n = 200  # rows [0, n): top-p 0.7; rows [n, 2n): top-k 2; one jitted call
  logits = jnp.log(jnp.tile(jnp.array([[0.5, 0.3, 0.15, 0.05]]), (2 * n, 1)))
  keys = jax.random.split(jax.random.PRNGKey(0), 2 * n)
  top_p = jnp.concatenate([jnp.full((n,), 0.7), jnp.ones((n,))])
  top_k = jnp.concatenate([jnp.zeros((n,), jnp.int32), jnp.full((n,), 2, jnp.int32)])
  tok, lp = jax.jit(sample_tokens)(logits, keys, jnp.ones((2 * n,)), top_p, top_k)
  tok = np.asarray(tok)
  np.testing.assert_allclose(np.asarray(lp), np.log([0.5, 0.3, 0.15, 0.05])[tok], atol=1e-6)
  # Top-p 0.7 keeps {0, 1} (mass before token 1 is 0.5 < 0.7, before token 2 is 0.8); top-k 2 keeps {0, 1}.
  assert set(tok[:n].tolist()) == {0, 1} and set(tok[n:].tolist()) == {0, 1}
  # Untruncated sampling reaches the tail (P(no token 3 in 400 draws) = 0.95^400 ≈ 1e-9).
  full, _ = jax.jit(sample_tokens)(logits, keys, jnp.ones((2 * n,)), jnp.ones((2 * n,)),
                                   jnp.zeros((2 * n,), jnp.int32))
  assert set(np.asarray(full).tolist()) == {0, 1, 2, 3}


def _reference_logprobs(logits, ids, mask, temperature):
  """float64 numpy reference of the aligned log-prob / entropy definition."""
  z = logits.astype(np.float64)[:, :-1] / temperature
  z = z - z.max(-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  lp = np.take_along_axis(logp, ids[:, 1:, None], -1)[..., 0]
  ent = -(np.exp(logp) * logp).sum(-1)
  valid = (mask[:, 1:] == 1) & (mask[:, :-1] == 1)
  zero = np.zeros((ids.shape[0], 1))
  return np.concatenate([zero, np.where(valid, lp, 0)], 1), np.concatenate([zero, np.where(valid, ent, 0)], 1)


def test_token_logprobs_match_float64_reference_and_gradients_with_remat():
  config = ModelConfig.tiny("qwen3")
  params = random_params(config, seed=6)
  ids, mask = padded_batch(np.random.default_rng(3), config.vocab_size, [9, 4], 9, left=True)
  logits = forward(config, params, ids, mask)
  lp, ent = jax.jit(lambda p: token_logprobs(p, config, ids, mask, 0.8, chunk_size=3, return_entropy=True))(params)
  want_lp, want_ent = _reference_logprobs(np.asarray(logits), ids, mask, 0.8)
  np.testing.assert_allclose(np.asarray(lp), want_lp, atol=1e-5, rtol=0)
  np.testing.assert_allclose(np.asarray(ent), want_ent, atol=1e-5, rtol=0)
  assert np.all(np.asarray(lp)[:, 0] == 0) and np.all(np.asarray(lp)[mask == 0] == 0)

  def chunked(p):  # also through per-layer remat: gradients must not change
    return jnp.sum(token_logprobs(p, config.replace(remat="dots_saveable"), ids, mask, 0.8, chunk_size=3))

  def unchunked(p):
    z, _ = CausalLM(config).apply({"params": p}, ids, mask)
    logp = jax.nn.log_softmax(z[:, :-1] / 0.8, axis=-1)
    lp = jnp.take_along_axis(logp, ids[:, 1:, None], -1)[..., 0]
    return jnp.sum(jnp.where((mask[:, 1:] == 1) & (mask[:, :-1] == 1), lp, 0))

  g1, g2 = jax.jit(jax.grad(chunked))(params), jax.jit(jax.grad(unchunked))(params)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)


def test_bfloat16_compute_stays_close_to_float32():
  config = ModelConfig.tiny("qwen3")
  params = random_params(config, seed=9)
  ids, mask = padded_batch(np.random.default_rng(5), config.vocab_size, [8, 5], 8)
  want = forward(config, params, ids, mask)
  bf16 = config.replace(dtype="bfloat16")
  got = forward(bf16, params, ids, mask)
  assert got.dtype == np.float32  # logits statistics stay float32
  real = mask.astype(bool)
  err = np.abs(got[real] - want[real]).max()
  assert 0 < err < 0.1 * np.abs(want[real]).max()


@pytest.mark.parametrize("seed", [0, 7, 2**31 - 1, -5])
def test_row_keys_in_the_program_equal_the_documented_fold_in(seed):
  """Row i samples with fold_in(PRNGKey(seed), i); the program derives the keys itself from an int32 seed."""
  from sao.models.sampling import _row_keys  # pylint: disable=import-outside-toplevel
  got = jax.jit(_row_keys, static_argnums=1)(np.int32(seed), 5)
  base = jax.random.PRNGKey(seed)
  want = jnp.stack([jax.random.fold_in(base, i) for i in range(5)])
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_seed_outside_int32_is_an_error_naming_it():
  config = ModelConfig.tiny("qwen3")
  sampler = Sampler(config, random_params(config, seed=4), batch_buckets=(4,))
  with pytest.raises(ValueError, match="seed: 4294967296"):
    sampler.generate([np.arange(3)], SamplingParams(max_new_tokens=2), seed=2**32)
