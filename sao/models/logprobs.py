"""Per-token log-probabilities of a sequence under the policy, chunked over time so that at most one
`[B, C, V]` float32 logits block exists at once, forward and backward.

Alignment (how trajectories store `rollout_logprobs`): the log-prob sits on the token being scored,
  `out[b, t] = log softmax(logits[b, t−1] / temperature)[input_ids[b, t]]`,  `out[b, 0] = 0`,
and `out[b, t] = 0` wherever `attention_mask[b, t] = 0` or `attention_mask[b, t−1] = 0` (no real context).
The distribution is the temperature-scaled softmax over the full vocabulary — the same one `sao.models.sampling`
reports for its sampled ids (before any top-p / top-k truncation).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from sao.models import sequence_parallel as sequence_parallel_lib
from sao.models.config import ModelConfig
from sao.models.mesh_axes import TENSOR_AXIS, constrainable_axes, logical_mesh_axes
from sao.models.transformer import CausalLM, unembedding

Array = jax.Array

# The unembedding inside the chunk loop: V over `tensor` as its parameter (`sao.models.sharding`'s `vocab` rule, not
# imported: sharding imports the transformer), E whole on every chip.
GATHERED_UNEMBEDDING_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (("vocab", (TENSOR_AXIS,)),)


def gather_unembedding(unembed: Array, whole: bool = False) -> Array:
  """unembed [V, E] constrained to V over `tensor` and E whole under the context mesh (`whole`: V whole too); the
  identity without one.

  Why: the parameter's E is sharded over `fsdp`. Left to itself, XLA's partitioner gathers it where the chunk loop
  reads it, once per chunk and again in the backward's recompute (on the v5p-128 slice of docs/tpu_hlo_breakdown.md,
  128 all-gathers of 0.5 GB per step, 0.28 s of the LM head's 0.39 s). Constrained here, before the loop, it is
  gathered once; the backward accumulates the gradient in this layout and reduces it once after the loop. `whole`
  serves sequence parallelism, where `tensor` splits the tokens: each chip scores its own tokens over the whole
  vocabulary."""
  axes = constrainable_axes(jax.sharding.get_abstract_mesh())
  if not axes:
    return unembed
  spec = (None, None) if whole else logical_mesh_axes(("vocab", None), unembed.shape, axes, GATHERED_UNEMBEDDING_RULES)
  return jax.lax.with_sharding_constraint(unembed, P(*spec))


def logits_from_hidden(hidden: Array, unembed: Array, dtype) -> Array:
  """hidden [..., E] @ unembed [V, E]ᵀ → float32 logits [..., V] (inputs in compute `dtype`, f32 accumulation).

  The same formula as `CausalLM.logits`, so sampler and trainer see bit-compatible logits.
  """
  return jnp.einsum("...e,ve->...v", hidden.astype(dtype), unembed.astype(dtype), preferred_element_type=jnp.float32)


def _token_shards(t: int, chunk: int, sequence_parallel: bool) -> int:
  """S, the contiguous parts of the time axis the chunk loop walks side by side: `tensor`'s size under sequence
  parallelism when S · chunk divides T (each chip then scores its own tokens, `sao.models.sequence_parallel`), else 1."""
  if not sequence_parallel:
    return 1
  shards = constrainable_axes(jax.sharding.get_abstract_mesh()).get(TENSOR_AXIS, 1)
  return shards if t % (shards * chunk) == 0 else 1


def logprobs_from_hidden(hidden: Array, unembed: Array, input_ids: Array, attention_mask: Array | None = None,
                         temperature: float | Array = 1.0, chunk_size: int = 128, return_entropy: bool = False,
                         dtype=None, sequence_parallel: bool = False) -> Array | tuple[Array, Array]:
  """Scores `input_ids` given backbone outputs.

  hidden: [B, T, E] (after the final norm); unembed: [V, E] (`transformer.unembedding`); input_ids,
  attention_mask: [B, T].
  Returns logprobs [B, T] float32 (and entropy [B, T] float32 of the same tempered distribution,
  `H = logsumexp(z) − Σ softmax(z)·z`, with the same zeros), aligned as in the module docstring.
  Position t's hidden state scores token t + 1 (the targets shift, not the [B, T, E] hidden states: a shift of
  those would move every row's tokens across the chips that `sequence_parallel` splits them over), and the scores
  shift back. Time is processed in chunks of `chunk_size` by `lax.map` over a `jax.checkpoint`ed function, so the
  backward pass also rebuilds one chunk's logits at a time; with `sequence_parallel` (`_token_shards`) each step of
  the loop takes one chunk from each of the S parts of the sequence that `tensor` holds, with the unembedding whole.
  """
  b, t, e = hidden.shape
  dtype = dtype or hidden.dtype
  if attention_mask is None:
    attention_mask = jnp.ones((b, t), jnp.int32)
  if t < 2:
    zeros = jnp.zeros((b, t), jnp.float32)
    return (zeros, zeros) if return_entropy else zeros
  targets = jnp.pad(input_ids[:, 1:], ((0, 0), (0, 1)))  # targets[t] = input_ids[t + 1]; the last is never used
  chunk = min(chunk_size, t)
  shards = _token_shards(t, chunk, sequence_parallel)
  n_chunks = -(-t // (chunk * shards))
  pad = n_chunks * chunk * shards - t
  if pad:
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
  # [n_chunks, B, S, C, ...] so lax.map walks over time chunks, S parts of the sequence side by side.
  h_parts = hidden.reshape(b, shards, n_chunks, chunk, e)
  if shards > 1:
    h_parts = sequence_parallel_lib.split_tokens(h_parts)
  h_chunks = h_parts.transpose(2, 0, 1, 3, 4)
  y_chunks = targets.reshape(b, shards, n_chunks, chunk).transpose(2, 0, 1, 3)
  unembed = gather_unembedding(unembed.astype(dtype), whole=shards > 1)  # once, not per chunk (`gather_unembedding`)

  @jax.checkpoint
  def score(args):
    h, y = args
    z = logits_from_hidden(h, unembed, dtype) / temperature  # [B, S, C, V] float32
    lse = jax.nn.logsumexp(z, axis=-1)
    lp = jnp.take_along_axis(z, y[..., None], axis=-1)[..., 0] - lse
    ent = lse - jnp.sum(jax.nn.softmax(z, axis=-1) * z, axis=-1)
    return lp, ent

  lp, ent = jax.lax.map(score, (h_chunks, y_chunks))  # [n_chunks, B, S, C]
  lp = lp.transpose(1, 2, 0, 3).reshape(b, -1)[:, :t - 1]  # lp[:, t] scores token t + 1
  ent = ent.transpose(1, 2, 0, 3).reshape(b, -1)[:, :t - 1]
  m = attention_mask.astype(bool)
  valid = m[:, 1:] & m[:, :-1]
  lp = jnp.concatenate([jnp.zeros((b, 1), jnp.float32), jnp.where(valid, lp, 0.0)], axis=1)
  if not return_entropy:
    return lp
  ent = jnp.concatenate([jnp.zeros((b, 1), jnp.float32), jnp.where(valid, ent, 0.0)], axis=1)
  return lp, ent


def token_logprobs(params: dict, config: ModelConfig, input_ids: Array, attention_mask: Array | None = None,
                   temperature: float | Array = 1.0, chunk_size: int = 128,
                   return_entropy: bool = False, routed_experts: Array | None = None) -> Array | tuple[Array, Array]:
  """Policy log-probs of `input_ids` [B, T] → [B, T] float32 (and entropy [B, T]); see the module docstring.

  `params` is the policy tree (`{'model', 'lm_head'?}`); temperature must be > 0 (greedy rollouts use 1).
  `routed_experts` [B, T, L, k] int32: MoE routing replay (the engine's expert ids per token and layer, −1 where
  none; `sao.models.moe.replay_route`), or None for the model's own routing.
  Differentiable; jit it from the caller (config is a static, hashable dataclass).
  """
  if isinstance(temperature, (int, float)) and temperature <= 0:
    raise ValueError(f"temperature: must be > 0, got {temperature}")
  hidden, _ = CausalLM(config).apply({"params": params}, input_ids, attention_mask, None, routed_experts,
                                     method=CausalLM.hidden)
  return logprobs_from_hidden(hidden, unembedding(params, config), input_ids, attention_mask, temperature,
                              chunk_size, return_entropy, dtype=jnp.dtype(config.dtype),
                              sequence_parallel=config.sequence_parallel)
