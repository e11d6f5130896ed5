"""KV-cache sampling: batched prompts of different lengths → sampled ids, their log-probs, finish reasons.

Shapes are bucketed (batch, prompt length, new tokens) so jit compiles a bounded number of programs; prompts are
left-padded, the batch is padded with empty rows. One jitted program per bucket runs prefill and a `lax.while_loop`
decode that stops when every row is done.

Log-probs: the returned `logprobs[i]` is `log softmax(logits / temperature)[token]` over the FULL vocabulary, i.e.
the distribution *before* top-p / top-k truncation, exactly what `sao.models.logprobs.token_logprobs` computes for the
same sequence at the same temperature (so DIS ratios are 1 on-policy). Greedy (temperature == 0) reports the
temperature-1 log-prob. Tokens are drawn from the truncated, renormalised distribution.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sao.models import prefix_state
from sao.models import routed_experts as routing
from sao.models.config import ModelConfig
from sao.models.prefix_state import RowState
from sao.models.transformer import CausalLM, init_cache

Array = jax.Array

PROMPT_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
NEW_TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """Per-request sampling settings (SGLang's names). top_k = 0 and top_p = 1 disable truncation."""
  max_new_tokens: int = 128
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  stop_token_ids: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Completion:
  """token_ids: [n] int32 (a sampled stop token is included); logprobs: [n] float32; finish_reason: stop | length;
  cached_tokens: prompt tokens whose state came from a cache instead of this call's prefill; routed_experts: when
  asked for, the experts each token this call fed was routed to, [P − cached_tokens + n, L, k] int32
  (`sao.models.routed_experts`: the prompt's prefilled tokens, then every sampled token, the last one included
  since it is fed to the cache too; SGLang's record of a request drops that last row)."""
  token_ids: np.ndarray
  logprobs: np.ndarray
  finish_reason: str
  cached_tokens: int = 0
  routed_experts: np.ndarray | None = None


def _bucket(n: int, buckets: Sequence[int], name: str) -> int:
  for b in buckets:
    if n <= b:
      return b
  raise ValueError(f"{name}: {n} exceeds the largest bucket {buckets[-1]}")


def sample_tokens(logits: Array, keys: Array, temperature: Array, top_p: Array,
                  top_k: Array) -> tuple[Array, Array]:
  """One sampling step. logits: [B, V] float32; keys: [B] PRNG keys; temperature, top_p: [B] float; top_k: [B] int.

  z = logits / τ (τ = 1 for greedy rows, i.e. temperature 0). Truncation: keep the top_k largest z (top_k > 0),
  then the smallest prefix of the renormalised sorted distribution whose mass reaches top_p; sample from
  softmax(z) restricted to the kept set. Greedy rows take argmax(logits).
  Returns (tokens [B] int32, log softmax(z)[token] [B] float32 over the full vocabulary).
  """
  vocab = logits.shape[-1]
  greedy = temperature <= 0
  tau = jnp.where(greedy, 1.0, temperature)
  z = logits / tau[:, None]
  logprobs = jax.nn.log_softmax(z, axis=-1)

  def truncate(z):
    z_sorted = -jnp.sort(-z, axis=-1)  # descending
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    rank = jnp.arange(vocab)[None, :]
    z_sorted = jnp.where(rank < k[:, None], z_sorted, -jnp.inf)
    p_sorted = jax.nn.softmax(z_sorted, axis=-1)
    mass_before = jnp.cumsum(p_sorted, axis=-1) - p_sorted
    keep_sorted = (mass_before < top_p[:, None]) & (rank < k[:, None])
    threshold = jnp.min(jnp.where(keep_sorted, z_sorted, jnp.inf), axis=-1)  # smallest kept value
    return jnp.where(z >= threshold[:, None], z, -jnp.inf)

  # The [B, V] sort dominates a small model's decode step on CPU: skip it when no sampled row truncates.
  needs_truncation = jnp.any(~greedy & ((top_k > 0) | (top_p < 1.0)))
  truncated = jax.lax.cond(needs_truncation, truncate, lambda z: z, z)
  sampled = jax.vmap(jax.random.categorical)(keys, truncated)
  tokens = jnp.where(greedy, jnp.argmax(logits, axis=-1), sampled).astype(jnp.int32)
  return tokens, jnp.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]


def _row_keys(seed: jax.Array, batch: int) -> jax.Array:
  """Row i's sampling key, fold_in(PRNGKey(seed), i), for i < batch: derived inside the jitted program (built
  eagerly, these few ops cost the engine more host time per call than the rest of its dispatch)."""
  base = jax.random.PRNGKey(seed)
  return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.arange(batch))


def _prefill_and_decode(params, cache, prompt_ids, prompt_mask, temperature, top_p, top_k, stop_ids,
                        max_new_tokens, seed, config: ModelConfig, max_new: int, capture_routing: bool = False):
  """Prefills prompt_ids [B, P] (left-padded, mask [B, P]) on top of `cache`, then decodes up to max_new tokens.

  Returns (ids [B, N], logprobs [B, N], lengths [B], stopped [B], final cache) with N = max_new; the final cache
  holds every real token fed (the cache's own, the prompt's, and every generated token, the last one included).
  `seed`: an int32 scalar; row i samples with `_row_keys(seed, B)[i]`. `capture_routing` (an MoE model): a sixth
  result, the experts of every token fed, [B, P + N, L, k] int32 (slot P + s: the token sampled at step s).
  """
  model = CausalLM(config)
  variables = {"params": params}
  batch = prompt_ids.shape[0]
  row_keys = _row_keys(seed, batch)

  def hidden_of(ids, mask, cache):
    """(hidden, cache, experts [B, t, L, k] or None) of feeding ids [B, t]."""
    if not capture_routing:
      return (*model.apply(variables, ids, mask, cache, method=CausalLM.hidden), None)
    (hidden, cache), captured = model.apply(variables, ids, mask, cache, method=CausalLM.hidden,
                                            mutable=[routing.COLLECTION])
    return hidden, cache, routing.stack_captured(config, captured, ids.shape)

  hidden, cache, prompt_routing = hidden_of(prompt_ids, prompt_mask, cache)
  logits = model.apply(variables, hidden[:, -1], method=CausalLM.logits)  # left padding: last slot is real
  routed = None
  if capture_routing:
    routed = jnp.full((batch, prompt_ids.shape[1] + max_new, config.num_layers, config.num_experts_per_tok),
                      routing.MISSING, jnp.int32)
    routed = routed.at[:, :prompt_ids.shape[1]].set(prompt_routing)

  def cond(state):
    step, _, _, _, _, done, _, _, _ = state
    return (step < max_new) & ~jnp.all(done)

  def body(state):
    step, cache, logits, out_ids, out_lp, done, lengths, stopped, routed = state
    keys = jax.vmap(lambda key: jax.random.fold_in(key, step))(row_keys)
    tokens, lp = sample_tokens(logits, keys, temperature, top_p, top_k)
    live = ~done
    out_ids = out_ids.at[:, step].set(jnp.where(live, tokens, 0))
    out_lp = out_lp.at[:, step].set(jnp.where(live, lp, 0.0))
    is_stop = live & jnp.any(tokens[:, None] == stop_ids, axis=-1)
    lengths = lengths + live.astype(jnp.int32)
    stopped = stopped | is_stop
    done = done | is_stop | (lengths >= max_new_tokens)
    hidden, cache, step_routing = hidden_of(tokens[:, None], live[:, None].astype(jnp.int32), cache)
    if capture_routing:
      routed = jax.lax.dynamic_update_slice_in_dim(routed, step_routing, prompt_ids.shape[1] + step, axis=1)
    logits = model.apply(variables, hidden[:, 0], method=CausalLM.logits)
    return step + 1, cache, logits, out_ids, out_lp, done, lengths, stopped, routed

  state = (jnp.int32(0), cache, logits, jnp.zeros((batch, max_new), jnp.int32),
           jnp.zeros((batch, max_new), jnp.float32), max_new_tokens <= 0, jnp.zeros((batch,), jnp.int32),
           jnp.zeros((batch,), bool), routed)
  _, cache, _, out_ids, out_lp, _, lengths, stopped, routed = jax.lax.while_loop(cond, body, state)
  if capture_routing:
    return out_ids, out_lp, lengths, stopped, cache, routed
  return out_ids, out_lp, lengths, stopped, cache


@functools.partial(jax.jit, static_argnames=("config", "max_new", "capture_routing"))
def _generate(params, prompt_ids, prompt_mask, temperature, top_p, top_k, stop_ids, max_new_tokens, seed,
              config: ModelConfig, max_new: int, capture_routing: bool = False):
  """prompt_ids/mask: [B, P] left-padded; stop_ids: [B, S] (−1 = none); max_new_tokens: [B] (0 = empty row).

  Returns (ids [B, N], logprobs [B, N], lengths [B], stopped [B]) with N = max_new, and with `capture_routing` the
  experts of every fed token [B, P + N, L, k].
  """
  cache = init_cache(config, prompt_ids.shape[0], prompt_ids.shape[1] + max_new)
  out = _prefill_and_decode(params, cache, prompt_ids, prompt_mask, temperature, top_p, top_k, stop_ids,
                            max_new_tokens, seed, config, max_new, capture_routing)
  return out[:4] + out[5:]


# Continues from a given cache (`sao.models.prefix_state.pack`); returns the final cache too (then the routing).
_generate_continuing = jax.jit(_prefill_and_decode, static_argnames=("config", "max_new", "capture_routing"))


class Sampler:
  """Holds params + bucket sizes; `generate` is numpy in / numpy out (the local engine's batching boundary)."""

  def __init__(self, config: ModelConfig, params: dict, *, prompt_buckets: Sequence[int] = PROMPT_BUCKETS,
               batch_buckets: Sequence[int] = BATCH_BUCKETS, new_token_buckets: Sequence[int] = NEW_TOKEN_BUCKETS,
               max_stop_ids: int = 16, suffix_buckets: Sequence[int] | None = None):
    self.config = config
    self.params = params
    self.prompt_buckets = tuple(prompt_buckets)
    self.batch_buckets = tuple(batch_buckets)
    self.new_token_buckets = tuple(new_token_buckets)
    self.max_stop_ids = max_stop_ids
    # generate_continuing pads the not-yet-cached part of the prompts to these (default: the prompt buckets).
    self.suffix_buckets = tuple(suffix_buckets or prompt_buckets)

  def update_params(self, params: dict) -> None:
    """Swaps in new weights (same tree and shapes: no recompilation)."""
    self.params = params

  def _checked(self, prompts, sampling_params) -> tuple[list[np.ndarray], list[SamplingParams]]:
    n = len(prompts)
    if isinstance(sampling_params, SamplingParams):
      sampling_params = [sampling_params] * n
    if len(sampling_params) != n:
      raise ValueError(f"sampling_params: {len(sampling_params)} entries for {n} prompts")
    vocab = self.config.vocab_size
    prompts = [np.asarray(p, np.int64).reshape(-1) for p in prompts]
    for i, (p, sp) in enumerate(zip(prompts, sampling_params)):
      if p.size == 0:
        raise ValueError(f"prompts[{i}]: empty prompt")
      if p.min() < 0 or p.max() >= vocab:
        raise ValueError(f"prompts[{i}]: token ids must be in [0, {vocab})")
      if sp.max_new_tokens < 1:
        raise ValueError(f"sampling_params[{i}].max_new_tokens: must be >= 1, got {sp.max_new_tokens}")
      if sp.temperature < 0 or not 0 < sp.top_p <= 1 or sp.top_k < 0:
        raise ValueError(f"sampling_params[{i}]: need temperature >= 0, 0 < top_p <= 1, top_k >= 0; got {sp}")
      if len(sp.stop_token_ids) > self.max_stop_ids:
        raise ValueError(f"sampling_params[{i}].stop_token_ids: more than {self.max_stop_ids} ids")
    return prompts, list(sampling_params)

  def _row_inputs(self, prompts: Sequence[np.ndarray], sampling_params: Sequence[SamplingParams], batch: int,
                  length: int, seed: int):
    """Left-padded ids/mask [batch, length] and the per-row sampling arrays (padding rows: max_new_tokens 0)."""
    ids = np.zeros((batch, length), np.int32)
    mask = np.zeros((batch, length), np.int32)
    stop = np.full((batch, self.max_stop_ids), -1, np.int32)
    temperature = np.ones((batch,), np.float32)
    top_p = np.ones((batch,), np.float32)
    top_k = np.zeros((batch,), np.int32)
    max_tokens = np.zeros((batch,), np.int32)  # padding rows: 0 → done before the first step
    for i, (p, sp) in enumerate(zip(prompts, sampling_params)):
      if p.size:
        ids[i, length - p.size:] = p
        mask[i, length - p.size:] = 1
      stop[i, :len(sp.stop_token_ids)] = sp.stop_token_ids
      temperature[i], top_p[i], top_k[i], max_tokens[i] = sp.temperature, sp.top_p, sp.top_k, sp.max_new_tokens
    if not -2**31 <= seed < 2**31:
      raise ValueError(f"seed: {seed} does not fit in int32")
    return ids, mask, temperature, top_p, top_k, stop, max_tokens, np.int32(seed)

  @staticmethod
  def _completions(n, out_ids, out_lp, lengths, stopped) -> list[Completion]:
    return [Completion(token_ids=np.asarray(out_ids[i, :lengths[i]], np.int32),
                       logprobs=np.asarray(out_lp[i, :lengths[i]], np.float32),
                       finish_reason="stop" if stopped[i] else "length") for i in range(n)]

  def _check_routing(self, return_routed_experts: bool) -> bool:
    if return_routed_experts and not self.config.num_experts:
      raise ValueError("return_routed_experts: the model has no MoE layers (num_experts = 0)")
    return bool(return_routed_experts)

  @staticmethod
  def _with_routing(completions: list[Completion], routed: np.ndarray, prompts: Sequence[np.ndarray],
                    slots: int) -> list[Completion]:
    """Row i's record from the captured [B, slots + N, L, k]: its prompt (left-padded, the last `len(prompt)` of
    the first `slots`), then its sampled tokens."""
    return [dataclasses.replace(c, routed_experts=np.concatenate(
        [routed[i, slots - p.size:slots], routed[i, slots:slots + c.token_ids.size]]).astype(np.int32))
            for i, (c, p) in enumerate(zip(completions, prompts))]

  def generate(self, prompts: Sequence[Sequence[int] | np.ndarray],
               sampling_params: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
               seed: int = 0, return_routed_experts: bool = False) -> list[Completion]:
    """Samples a completion for every prompt (token id lists). Row i uses PRNG key fold_in(PRNGKey(seed), i).
    `return_routed_experts` (an MoE model): each completion carries its `routed_experts`."""
    n = len(prompts)
    if n == 0:
      return []
    capture = self._check_routing(return_routed_experts)
    prompts, sampling_params = self._checked(prompts, sampling_params)
    batch = _bucket(n, self.batch_buckets, "batch size")
    length = _bucket(max(p.size for p in prompts), self.prompt_buckets, "prompt length")
    max_new = _bucket(max(sp.max_new_tokens for sp in sampling_params), self.new_token_buckets, "max_new_tokens")
    inputs = self._row_inputs(prompts, sampling_params, batch, length, seed)
    outputs = jax.device_get(_generate(self.params, *inputs, config=self.config, max_new=max_new,
                                       capture_routing=capture))
    completions = self._completions(n, *outputs[:4])
    return self._with_routing(completions, outputs[4], prompts, length) if capture else completions

  def generate_continuing(self, prompts: Sequence[Sequence[int] | np.ndarray],
                          sampling_params: SamplingParams | Sequence[SamplingParams],
                          prefixes: Sequence[RowState | None], seed: int = 0, return_routed_experts: bool = False
                          ) -> tuple[list[Completion], list[RowState]]:
    """`generate`, where row i's first `prefixes[i].length` prompt tokens are not prefilled: their state is given
    (a `RowState` of exactly those tokens, or None). Returns the completions and, per row, the state after
    prompt + completion (what a later request that extends this conversation continues from).

    Shapes: the batch is padded to a batch bucket, the longest remaining suffix to a `suffix_buckets` bucket Pb, the
    longest prefix to Lb prefix slots: 0 when no row has one, else Lb = (the smallest prompt bucket >= longest
    prefix + Pb) − Pb, so prefix and suffix together span what an uncached call's prompt would (when no prompt
    bucket holds both: Lb = the longest prefix's prompt bucket). The number of compiled programs stays bounded
    (at most 1 + |prompt buckets| · |suffix buckets| per batch and new-token bucket) whatever the prefix lengths;
    `sao.models.prefix_state` has the layout.
    Row i's sampling key is the same as in `generate`; log-probs equal `generate`'s up to float rounding (a cached
    token's keys/values were computed in an earlier prefill or decode step, not in this prefill).
    `return_routed_experts`: as in `generate`, covering the tokens this call feeds (a row with a prefix: its
    suffix and sampled tokens; the prefix's routing is the caller's to keep, `sao.engines.routed_prefix`).
    """
    n = len(prompts)
    if n == 0:
      return [], []
    capture = self._check_routing(return_routed_experts)
    prompts, sampling_params = self._checked(prompts, sampling_params)
    if len(prefixes) != n:
      raise ValueError(f"prefixes: {len(prefixes)} entries for {n} prompts")
    reused = [0 if p is None else p.length for p in prefixes]
    for i, (p, used) in enumerate(zip(prompts, reused)):
      if not 0 <= used < p.size:
        raise ValueError(f"prefixes[{i}]: a prefix of {used} tokens must be shorter than its prompt ({p.size})")
    suffixes = [p[used:] for p, used in zip(prompts, reused)]
    batch = _bucket(n, self.batch_buckets, "batch size")
    length = _bucket(max(s.size for s in suffixes), self.suffix_buckets, "prompt suffix length")
    prefix_slots = 0
    if max(reused):  # prefix + suffix slots fill a prompt bucket (the span an uncached call would have), if one fits
      fits = [b for b in self.prompt_buckets if b >= max(reused) + length]
      prefix_slots = fits[0] - length if fits else _bucket(max(reused), self.prompt_buckets, "prefix length")
    max_new = _bucket(max(sp.max_new_tokens for sp in sampling_params), self.new_token_buckets, "max_new_tokens")
    cache = prefix_state.pack(self.config, prefixes, batch, prefix_slots, prefix_slots + length + max_new)
    inputs = self._row_inputs(suffixes, sampling_params, batch, length, seed)
    outputs = jax.device_get(_generate_continuing(self.params, cache, *inputs, config=self.config, max_new=max_new,
                                                  capture_routing=capture))
    cache = outputs[4]
    completions = [dataclasses.replace(c, cached_tokens=used)
                   for c, used in zip(self._completions(n, *outputs[:4]), reused)]
    if capture:
      completions = self._with_routing(completions, outputs[5], suffixes, length)
    states = prefix_state.unpack(cache, [p.size + c.token_ids.size for p, c in zip(prompts, completions)])
    return completions, states


def generate(config: ModelConfig, params: dict, prompts: Sequence[Sequence[int] | np.ndarray],
             sampling_params: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
             seed: int = 0) -> list[Completion]:
  """One-shot `Sampler(config, params).generate(...)` (compiled programs are cached across calls)."""
  return Sampler(config, params).generate(prompts, sampling_params, seed)
