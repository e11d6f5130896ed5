"""Skip-observation GAE as chunk-local triangular matmuls, processed in cache-sized blocks of the time axis.

The recursion of `sao.core.advantages.gae` (docs/algorithm.md), written for the state `h` that enters an action
token's advantage, `A'_t = r_t − V_t + h_t`, is a sum over the action tokens after `t`:

    h_t = Σ_{s>t, m_s=1} g^{K_s − J_t} e_s,   e_s = γ·V_s + g·(r_s − V_s),   g = γ·λ_b,

with `K_s` the number of action tokens before `s` and `J_t = K_t + m_t` those up to and including `t`, so the
exponent counts the action tokens strictly between `t` and `s` (observation tokens are bridged: they cost no
discount step). Within a chunk of `L` tokens the weight factors, `g^{K_s − J_t} = g^{K_s − L/2} · g^{L/2 − J_t}`,
so the chunk-local part is a scaled strict reverse cumulative sum: one `[·, L] @ [L, L]` matmul against a constant
0/1 triangle (the "segment sum" of state-space models) instead of an `L`-step loop. Both factors stay within
`g^{±L/2}`, so the scaling is exact in float32 while `g^{L/2}` stays far from underflow; `fits` says when it does.
Between chunks the state obeys a short affine recurrence on `[B]` vectors, carried right to left through the blocks.
The in-chunk counts `K_t` are popcounts of the chunk's mask packed into one word (exact integers, elementwise).
`advantages_returns_and_moments` also returns the masked mean and centred sum of squares of `A` from the same pass,
so that whitening (`sao.core.advantages.whitened_gae`) reads `A` once more instead of three times.
"""
import jax
import jax.numpy as jnp

CHUNK = 16  # at most 32: a chunk's mask is packed into one uint32 word
# Largest |exponent| a factor takes is CHUNK/2; keep g^{±CHUNK/2} within 2^{±64} so that neither the factors nor
# their products with rewards and values below ~2^{58} in magnitude overflow or leave the normal float32 range.
_MAX_LOG2_SCALE = 64.0
G_MIN = 2.0 ** (-_MAX_LOG2_SCALE / (CHUNK // 2))  # ≈ 0.0039


def fits(gamma_lam: jax.Array, mask: jax.Array) -> jax.Array:
  """Scalar bool: every sequence with an action token has `G_MIN ≤ g ≤ 1/G_MIN` (`g = γλ_b`, `[B]`).

  Outside that range (λ = 0, γ = 0, λ below ~0.004) `g^{−L/2}` leaves the float32 range and the factored weights
  are not exact; callers use the scan there. Sequences without an action token have all-zero advantages whatever g.
  """
  return jnp.all(_in_range(gamma_lam) | ~jnp.any(mask, axis=-1))


def _in_range(gamma_lam):
  return (gamma_lam >= G_MIN) & (gamma_lam <= 1.0 / G_MIN)


def advantages_and_returns(rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: jax.Array,
                           gamma_lam: jax.Array, block: int = 256) -> tuple[jax.Array, jax.Array]:
  """`(A, R = A + V)`, both `[B, T]` and 0 where `m = 0`; exact when `fits(gamma_lam, mask)`.

  The time axis is processed right to left in blocks of `block` tokens (`[B, block]` tiles, a few hundred KB), so
  every intermediate stays in cache and the only `[B, T]` traffic is reading the inputs and writing `A` and `R` once.

  Args:
    rewards, values: `[B, T]` in the compute dtype.
    mask: `[B, T]` bool action mask.
    gamma: scalar γ.
    gamma_lam: `[B]` per-sequence `g = γ·λ_b`.
    block: tokens per tile, a multiple of `CHUNK` (rounded down to the padded length when `T` is shorter).
  """
  adv, ret, _ = _run(rewards, values, mask, gamma, gamma_lam, block, moments=False)
  return adv, ret


def advantages_returns_and_moments(rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: jax.Array,
                                   gamma_lam: jax.Array, block: int = 256
                                   ) -> tuple[jax.Array, jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
  """`(A, R, (n, mean, M2))`: `advantages_and_returns` plus the masked moments of `A`, from the same pass.

  `n = Σ m`, `mean = Σ m·A / n` and `M2 = Σ m·(A − mean)²` (scalars; mean = M2 = 0 when n = 0), so whitening
  needs one more read of `A` instead of three. Each block's tile, still in cache, gives its own count, mean and
  centred sum of squares; blocks are merged with Chan et al.'s pairwise update
  `M2 = M2_a + M2_b + δ²·n_a·n_b/n`, `δ = mean_b − mean_a`, which never subtracts two large sums of squares
  (the one-pass `Σ A² − n·mean²` loses all float32 digits when |mean| ≫ std).
  """
  return _run(rewards, values, mask, gamma, gamma_lam, block, moments=True)


def _merge_moments(a, b):
  """Chan et al.'s pairwise merge of `(n, mean, M2)` triples (scalars)."""
  n_a, mean_a, m2_a = a
  n_b, mean_b, m2_b = b
  n = n_a + n_b
  delta = mean_b - mean_a
  weight_b = n_b / jnp.maximum(n, 1.0)
  return n, mean_a + delta * weight_b, m2_a + m2_b + delta * delta * n_a * weight_b


def _run(rewards, values, mask, gamma, gamma_lam, block, moments):
  batch, num_tokens = rewards.shape
  length, half = CHUNK, CHUNK // 2
  dtype = rewards.dtype
  no_moments = (jnp.zeros((), dtype),) * 3
  if block % length:
    raise ValueError(f"block must be a multiple of {length}, got {block}")
  if num_tokens == 0 or batch == 0:
    return jnp.zeros_like(rewards), jnp.zeros_like(rewards), no_moments
  block = min(block, -(-num_tokens // length) * length)
  num_blocks = -(-num_tokens // block)
  pad = num_blocks * block - num_tokens
  if pad:  # trailing observation tokens change nothing: they are bridged and their rewards ignored
    rewards, values = (jnp.pad(x, ((0, 0), (0, pad))) for x in (rewards, values))
    mask = jnp.pad(mask, ((0, 0), (0, pad)))
  chunks = block // length
  # Rows without an action token have all-zero advantages whatever g, and when `fits` is false the caller discards
  # this result (under `vmap` a `lax.cond` computes both branches): g = 1 there keeps every intermediate finite
  # (log 0 would put inf and NaN into the discarded branch).
  gamma_lam = jnp.where(_in_range(gamma_lam) & jnp.any(mask, axis=-1), gamma_lam, 1.0)
  log_g = jnp.log(gamma_lam)[:, None]  # [B, 1], finite when fits()
  g3, log_g3 = gamma_lam[:, None, None], log_g[:, :, None]
  scale_left = jnp.exp(half * log_g)  # g^{L/2}

  position = jnp.arange(length)
  earlier = (position[:, None] < position[None, :]).astype(dtype)  # [s, t] = 1 where s < t
  bit = jnp.left_shift(jnp.uint32(1), position.astype(jnp.uint32))  # [L]: 2^t
  below_bits = bit - 1  # [L]: the bits of positions s < t

  def chunk_matmul(x, triangle):  # [B, C, L] @ [L, L] as one 2-D matmul; float32 even where the default is not
    out = jnp.matmul(x.reshape(-1, length), triangle, precision=jax.lax.Precision.HIGHEST)
    return out.reshape(x.shape)

  def tile(x, start):
    return jax.lax.dynamic_slice_in_dim(x, start, block, axis=1).reshape(batch, chunks, length)

  def block_step(i, carry):
    adv, ret, state, stats = carry  # state: H entering this block from its right, [B]
    start = (num_blocks - 1 - i) * block
    r, v, mb = tile(rewards, start), tile(values, start), tile(mask, start)
    m = mb.astype(dtype)
    # K_t within the chunk, exactly: the chunk's mask as a 16-bit word, then the set bits below t. Elementwise, so it
    # fuses into the exponential below (a [·, L] @ [L, L] matmul of the mask cost ~20 % of the kernel).
    bits = jnp.sum(jnp.where(mb, bit, jnp.uint32(0)), axis=-1, dtype=jnp.uint32)[..., None]  # [B, C, 1]
    actions_before = jax.lax.population_count(bits & below_bits).astype(dtype)
    # x_s = g^{K_s − L/2}·e_s on action tokens; `where`, not a product, so observation tokens' values never leak.
    x = jnp.where(mb, jnp.exp((actions_before - half) * log_g3) * (gamma * v + g3 * (r - v)), 0.0)
    after_sum = chunk_matmul(x, earlier.T)  # Σ_{s>t} x_s within the chunk
    chunk_actions = actions_before[..., -1] + m[..., -1]  # n_k, [B, C]
    entering_left = scale_left * jnp.sum(x, axis=-1)  # Σ_s g^{K_s}·e_s, [B, C]
    chunk_decay = jnp.exp(chunk_actions * log_g)  # g^{n_k}
    # Between chunks, right to left: H_k = entering_left_k + g^{n_k}·H_{k+1}; chunk k sees H_{k+1}.
    from_right = []
    for k in reversed(range(chunks)):
      from_right.append(state)
      state = entering_left[:, k] + chunk_decay[:, k] * state
    from_right = jnp.stack(from_right[::-1], axis=1) * jnp.exp((chunk_actions - half) * log_g)  # g^{n_k−L/2}·H_{k+1}
    h = jnp.exp((half - actions_before - m) * log_g3) * (after_sum + from_right[..., None])
    a = jnp.where(mb, r - v + h, 0.0)
    if moments:  # the tile is in cache: its own mean first, then the centred squares
      count = jnp.sum(m)
      mean = jnp.sum(a) / jnp.maximum(count, 1.0)
      stats = _merge_moments(stats, (count, mean, jnp.sum(jnp.where(mb, jnp.square(a - mean), 0.0))))
    adv = jax.lax.dynamic_update_slice_in_dim(adv, a.reshape(batch, block), start, axis=1)
    ret = jax.lax.dynamic_update_slice_in_dim(ret, jnp.where(mb, a + v, 0.0).reshape(batch, block), start, axis=1)
    return adv, ret, state, stats

  zeros = jnp.zeros((batch, num_blocks * block), dtype)
  adv, ret, _, stats = jax.lax.fori_loop(0, num_blocks, block_step,
                                         (zeros, zeros, jnp.zeros((batch,), dtype), no_moments))
  return adv[:, :num_tokens], ret[:, :num_tokens], stats
