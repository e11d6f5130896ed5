"""Decoder-only LM (`CausalLM`) and value model (`Critic`) in flax.linen, with a functional KV cache.

Parameter tree (mirrors HF names, so `.*self_attn.*` / `.*linear_attn.*` select attention):
  {'model': {'embed_tokens': {'embedding': [V, E]},
             'layers_0': {'input_layernorm': {'scale'}, 'self_attn': {'q_proj': {'kernel', 'bias'?}, 'k_proj', 'v_proj',
                          'o_proj', 'q_norm'?, 'k_norm'?}, 'post_attention_layernorm': {'scale'},
                          'mlp': {'gate_proj', 'up_proj', 'down_proj'} | {'gate': {'kernel'}, 'experts': {...},
                                  'shared_expert'?: {...}, 'shared_expert_gate'?: {'kernel'}}},
             'layers_j': {..., 'linear_attn': {...}, ...}   (linear_attention blocks: sao.models.gated_deltanet)
             ..., 'norm': {'scale'}},
   'lm_head': {'kernel': [V, E]}            (absent when tie_word_embeddings)
   'value_head': {'kernel': [1, E], 'bias': [1]}   (Critic only, instead of lm_head)}
Linear kernels are `[out..., in...]`, HF's `nn.Linear` layout (`sao.models.layers.Linear`, `PARAM_LAYOUT`).

Cache (a plain pytree passed in and returned; `init_cache` builds it):
  {'index': [B] int32  next slot to write per row,
   'mask': [B, S] bool  slot holds a real token,
   'layers': {'layers_i': per-layer entry}}   full attention: {'k', 'v': [B, S, kv_heads, head_dim]};
                                                 linear attention: {'conv': [B, K − 1, C], 'state': [B, Hv, Dk, Dv]}.

`ModelConfig.scan_layers`: calls without a cache run the layers as a `lax.scan` over periods of layer kinds, the
per-layer params stacked at forward time (`sao.models.scan`; the tree above is unchanged).

Positions are computed from masks (count of real tokens before this one), so left padding and per-row prompt lengths
need no separate position input.
"""
from __future__ import annotations

import functools

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from sao.models import scan
from sao.models.attention import AttentionMask
from sao.models.config import REMAT_POLICIES, ModelConfig
from sao.models.gated_deltanet import GatedDeltaNet, linear_attention_cache
from sao.models.layers import MLP, Attention, Linear, MoE, dtypes, kernel_init, linear_init, norm

Array = jax.Array
Cache = dict[str, Any]


def init_cache(config: ModelConfig, batch_size: int, max_length: int, dtype: Any = None) -> Cache:
  """An empty cache for `batch_size` rows of up to `max_length` tokens (prompt + generated), dtype = compute dtype."""
  dtype = jnp.dtype(dtype or config.dtype)
  layers = {}
  for i, kind in enumerate(config.layer_types):
    if kind == "linear_attention":
      layers[f"layers_{i}"] = linear_attention_cache(config, batch_size, dtype)
      continue
    if kind != "full_attention":
      raise ValueError(f"layer_types[{i}]: no cache layout for block type {kind!r}")
    shape = (batch_size, max_length, config.num_kv_heads, config.head_dim)
    layers[f"layers_{i}"] = {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
  return {"index": jnp.zeros((batch_size,), jnp.int32), "mask": jnp.zeros((batch_size, max_length), bool),
          "layers": layers}


def _positions_and_mask(attention_mask: Array, cache: Cache | None
                        ) -> tuple[Array, AttentionMask, Array | None, Array | None]:
  """Returns (positions [B, T], attention mask, write index [B] or None, new slot mask or None).

  The mask is factored (`AttentionMask`: key validity [B, S], query slots [B, T]), never a [B, T, S] array.
  No cache: `pos[b,t] = max(Σ_{u<=t} m[b,u] − 1, 0)` and `mask[b,t,s] = s <= t ∧ m[b,s]`.
  Cache: this chunk occupies slots `index[b] + t`; positions continue from the number of real cached tokens, and
  `mask[b,t,s] = s <= index[b] + t ∧ slot_mask'[b,s]`, slot_mask' = cache mask with this chunk's m written in.
  """
  m = attention_mask.astype(jnp.int32)
  t = m.shape[1]
  if cache is None:
    positions = jnp.maximum(jnp.cumsum(m, axis=1) - 1, 0)
    return positions, AttentionMask(attention_mask.astype(bool)), None, None
  index, slot_mask = cache["index"], cache["mask"]
  prior = jnp.sum(slot_mask, axis=1, dtype=jnp.int32)  # real tokens already cached
  positions = jnp.maximum(prior[:, None] + jnp.cumsum(m, axis=1) - 1, 0)
  new_slot_mask = jax.vmap(lambda row, upd, i: jax.lax.dynamic_update_slice(row, upd, (i,)))(
      slot_mask, attention_mask.astype(bool), index)
  query_slot = index[:, None] + jnp.arange(t)[None, :]  # [B, T]
  return positions, AttentionMask(new_slot_mask, query_slot), index, new_slot_mask


class DecoderLayer(nn.Module):
  """Pre-norm block: `h = x + mixer(norm(x)); y = h + mlp(norm(h))`. `layer_idx` picks the token mixer
  (`self_attn` or `linear_attn`) and the MLP kind."""
  config: ModelConfig
  layer_idx: int

  @nn.compact
  def __call__(self, x: Array, positions: Array, mask: AttentionMask, token_mask: Array, write_index: Array | None,
               cache: dict[str, Array] | None, replayed: Array | None = None) -> tuple[Array, dict[str, Array] | None]:
    """x: [B, T, E]; positions, token_mask: [B, T]; mask: full attention's visibility; cache: this layer's
    entry or None; replayed: [B, T, k] expert ids for an MoE layer's routing replay (`MoE`) or None. Returns
    (y [B, T, E], updated entry or None)."""
    cfg = self.config
    kind = cfg.layer_types[self.layer_idx]
    h = norm(cfg, "input_layernorm")(x)
    if kind == "full_attention":
      h, cache = Attention(cfg, name="self_attn")(h, positions, mask, write_index, cache)
    elif kind == "linear_attention":
      h, cache = GatedDeltaNet(cfg, name="linear_attn")(h, token_mask, cache)
    else:
      raise ValueError(f"layer_types[{self.layer_idx}]: unsupported block type {kind!r}")
    x = x + h
    h = norm(cfg, "post_attention_layernorm")(x)
    if cfg.is_moe_layer(self.layer_idx):
      return x + MoE(cfg, name="mlp")(h, replayed), cache
    return x + MLP(cfg, name="mlp")(h), cache


class Backbone(nn.Module):
  """Embeddings + decoder layers + final norm (`model` in the param tree)."""
  config: ModelConfig

  @nn.compact
  def __call__(self, input_ids: Array, attention_mask: Array | None = None, cache: Cache | None = None,
               routed_experts: Array | None = None) -> tuple[Array, Cache | None]:
    """input_ids, attention_mask: [B, T] (mask 1 = real token); routed_experts: [B, T, L, k] int32 expert ids to
    replay (SGLang's `routed_experts` layout per row; −1 where nothing is replayed) or None. Returns (hidden
    [B, T, E] after the final norm, updated cache or None)."""
    cfg = self.config
    replays = layer_replays(cfg, routed_experts, input_ids.shape)
    dtype, param_dtype = dtypes(cfg)
    if attention_mask is None:
      attention_mask = jnp.ones(input_ids.shape, jnp.int32)
    positions, mask, write_index, new_slot_mask = _positions_and_mask(attention_mask, cache)
    embed = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=dtype, param_dtype=param_dtype,
                     embedding_init=kernel_init("vocab", "embed"), name="embed_tokens")
    x = embed(input_ids)
    new_layers = {}
    if cfg.scan_layers and cache is None and not self.is_initializing():
      # Init and cached (sampling) calls take the unrolled loop: the former creates the per-layer tree, the latter
      # threads a per-layer cache.
      layers = nn.meta.unbox(self.variables["params"])
      x = _scanned_layers(cfg, [(layers[f"layers_{i}"], replays[i]) for i in range(cfg.num_layers)], x, positions,
                          mask, attention_mask)
    else:
      layer_cls = DecoderLayer
      if cfg.remat != "none":
        policy = getattr(jax.checkpoint_policies, REMAT_POLICIES[cfg.remat])
        layer_cls = nn.remat(DecoderLayer, policy=policy, prevent_cse=True)
      for i in range(cfg.num_layers):
        name = f"layers_{i}"
        entry = None if cache is None else cache["layers"][name]
        x, entry = layer_cls(cfg, i, name=name)(x, positions, mask, attention_mask, write_index, entry, replays[i])
        new_layers[name] = entry
    x = norm(cfg, "norm")(x)
    new_cache = None
    if cache is not None:
      new_cache = {"index": cache["index"] + input_ids.shape[1], "mask": new_slot_mask, "layers": new_layers}
    return x, new_cache


def layer_replays(cfg: ModelConfig, routed_experts: Array | None, ids_shape: tuple[int, ...]) -> list[Array | None]:
  """Per layer: its slice `routed_experts[:, :, i]` [B, T, k] for an MoE layer, None for a dense one or without
  replay. routed_experts: [B, T, L, k] (ids_shape = (B, T)) or None."""
  if routed_experts is None:
    return [None] * cfg.num_layers
  expected = (*ids_shape, cfg.num_layers, cfg.num_experts_per_tok)
  if not cfg.num_experts or routed_experts.shape != expected:
    raise ValueError(f"routed_experts: shape {routed_experts.shape}, expected [B, T, layers, top_k] = {expected}"
                     + ("" if cfg.num_experts else " (and a model with MoE layers)"))
  return [routed_experts[:, :, i] if cfg.is_moe_layer(i) else None for i in range(cfg.num_layers)]


def _scanned_layers(cfg: ModelConfig, layer_inputs: list[tuple[dict, Array | None]], x: Array, positions: Array,
                    mask: AttentionMask, token_mask: Array) -> Array:
  """The decoder layers without a cache as `sao.models.scan` runs them: one `lax.scan` over the periods of layer
  kinds, then the layers that do not fill a period, each layer applied functionally to its own params and replayed
  experts (`layer_replays`; stacked per period like the params) with remat per layer as `cfg.remat` says.
  x: [B, T, E] → [B, T, E]; the same function of the params as the unrolled loop."""
  policy = None if cfg.remat == "none" else getattr(jax.checkpoint_policies, REMAT_POLICIES[cfg.remat])

  def layer_fn(i: int, in_scan: bool):
    module = DecoderLayer(cfg, i, parent=None)  # unbound: applied to the params it is given

    def apply(layer_input: tuple[dict, Array | None], h: Array) -> Array:
      params, replayed = layer_input
      return module.apply({"params": params}, h, positions, mask, token_mask, None, None, replayed)[0]
    # Inside a scan body XLA cannot CSE the recomputation into the forward pass, so `prevent_cse` is only needed
    # for the layers after the scan.
    return apply if policy is None else jax.checkpoint(apply, policy=policy, prevent_cse=not in_scan)

  period = scan.layer_period(cfg)
  num_scanned = cfg.num_layers // period * period
  x = scan.scan_periods([layer_fn(j, True) for j in range(period)],
                        scan.stack_periods(layer_inputs[:num_scanned], period), x, cfg.sequence_parallel)
  for i in range(num_scanned, cfg.num_layers):
    x = layer_fn(i, False)(layer_inputs[i], scan.shard_residual(x, cfg.sequence_parallel))
  return x


class CausalLM(nn.Module):
  """Policy LM. `__call__` → (logits [B, T, V] float32, cache); `hidden` and `logits` split it in two."""
  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.model = Backbone(cfg)
    if not cfg.tie_word_embeddings:
      self.lm_head = LMHead(cfg)

  def __call__(self, input_ids: Array, attention_mask: Array | None = None, cache: Cache | None = None,
               routed_experts: Array | None = None) -> tuple[Array, Cache | None]:
    hidden, cache = self.model(input_ids, attention_mask, cache, routed_experts)
    return self.logits(hidden), cache

  def hidden(self, input_ids: Array, attention_mask: Array | None = None, cache: Cache | None = None,
             routed_experts: Array | None = None) -> tuple[Array, Cache | None]:
    """(hidden [B, T, E] after the final norm, cache); `routed_experts` [B, T, L, k]: routing replay (`Backbone`)."""
    return self.model(input_ids, attention_mask, cache, routed_experts)

  def logits(self, hidden: Array) -> Array:
    """hidden [..., E] → float32 logits [..., V] = hidden @ W_unembedᵀ, W_unembed `[V, E]`."""
    if self.config.tie_word_embeddings:
      w = nn.meta.unbox(self.model.variables["params"]["embed_tokens"]["embedding"])
      dtype = jnp.dtype(self.config.dtype)
      return jnp.einsum("...e,ve->...v", hidden.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32)
    return self.lm_head(hidden)


class LMHead(nn.Module):
  """Untied unembedding, `lm_head.kernel [vocab, embed]` (HF layout); logits accumulated in float32."""
  config: ModelConfig

  @nn.compact
  def __call__(self, hidden: Array) -> Array:
    cfg = self.config
    dtype, param_dtype = dtypes(cfg)
    w = self.param("kernel", linear_init(0, 1, "vocab", "embed"), (cfg.vocab_size, cfg.hidden_size), param_dtype)
    return jnp.einsum("...e,ve->...v", hidden.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32)


class Critic(nn.Module):
  """Value model: the policy backbone + `value_head` (E → 1 with bias). `__call__` → values [B, T] float32."""
  config: ModelConfig

  def setup(self):
    _, param_dtype = dtypes(self.config)
    self.model = Backbone(self.config)
    self.value_head = Linear(1, (None, "embed"), (None,), use_bias=True, dtype=jnp.float32, param_dtype=param_dtype,
                             stddev=1e-3)

  def __call__(self, input_ids: Array, attention_mask: Array | None = None) -> Array:
    hidden, _ = self.model(input_ids, attention_mask)
    return self.values(hidden)

  def hidden(self, input_ids: Array, attention_mask: Array | None = None) -> tuple[Array, None]:
    """(hidden [B, T, E] after the final norm, None)."""
    return self.model(input_ids, attention_mask)

  def values(self, hidden: Array) -> Array:
    """hidden [B, T, E] → values [B, T] float32 (`hidden @ kernel + bias` in float32)."""
    return self.value_head(hidden.astype(jnp.float32))[..., 0]


def unembedding(params: dict, config: ModelConfig) -> Array:
  """The `[V, E]` unembedding matrix of policy params (tied: embed_tokens.embedding; else lm_head.kernel)."""
  if config.tie_word_embeddings:
    return params["model"]["embed_tokens"]["embedding"]
  return params["lm_head"]["kernel"]


def abstract_params(config: ModelConfig, critic: bool = False) -> dict:
  """Shape/dtype tree with `nn.LogicallyPartitioned` leaves (logical axis names), without allocating.

  Memoised per (config, critic): tracing the model's `init` is most of the cost of an engine's weight reload (the
  tree is rebuilt, so callers may change the returned containers)."""
  # Keyed on the ambient mesh too: under `jax.set_mesh` the traced shapes may carry shardings.
  mesh = jax.sharding.get_abstract_mesh()
  try:
    cached = _abstract_params(config, critic, mesh)
  except TypeError:  # an unhashable config (a list-valued field): trace it afresh
    cached = _abstract_params.__wrapped__(config, critic, mesh)
  return jax.tree.map(lambda leaf: leaf, cached)


@functools.lru_cache(maxsize=16)
def _abstract_params(config: ModelConfig, critic: bool, mesh: Any) -> dict:
  del mesh  # part of the cache key only
  module = Critic(config) if critic else CausalLM(config)
  ids = jnp.zeros((1, 1), jnp.int32)
  return jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), ids))["params"]


def init_params(config: ModelConfig, rng: Array, critic: bool = False, shardings: Any = None) -> dict:
  """Random params (plain arrays, logical boxes removed): `{'model': ..., 'lm_head' | 'value_head': ...}`.

  `shardings` (e.g. `sao.models.sharding.param_shardings(config, mesh)`) creates every param already sharded.
  """
  module = Critic(config) if critic else CausalLM(config)
  ids = jnp.zeros((1, 1), jnp.int32)
  return jax.jit(lambda key: nn.meta.unbox(module.init(key, ids)["params"]), out_shardings=shardings)(rng)


def init_critic_from_policy(policy_params: dict, rng: Array, init_scale: float = 1e-3) -> dict:
  """Critic params: a copy of the policy's `model` subtree + a fresh value head (kernel `[1, E]` ~ N(0, init_scale²),
  bias 0).

  The head starts near zero so initial values ≈ 0 and the first value-loss gradients are small.
  """
  if "model" not in policy_params:
    raise ValueError("policy_params: missing the 'model' subtree")
  embedding = policy_params["model"]["embed_tokens"]["embedding"]
  hidden = embedding.shape[1]
  kernel = (init_scale * jax.random.normal(rng, (hidden, 1), jnp.float32)).astype(embedding.dtype).T  # [1, E]
  return {"model": jax.tree.map(jnp.array, policy_params["model"]),
          "value_head": {"kernel": kernel, "bias": jnp.zeros((1,), embedding.dtype)}}
