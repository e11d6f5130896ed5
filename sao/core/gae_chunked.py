"""Skip-observation GAE as chunk-local triangular matmuls plus a parallel scan over chunk boundaries, by row groups.

The recursion of `sao.core.advantages.gae` (docs/algorithm.md), written for the state `h` that enters an action
token's advantage, `A'_t = r_t − V_t + h_t`, is a sum over the action tokens after `t`:

    h_t = Σ_{s>t, m_s=1} g^{K_s − J_t} e_s,   e_s = γ·V_s + g·(r_s − V_s),   g = γ·λ_b,

with `K_s` the number of action tokens before `s` and `J_t = K_t + m_t` those up to and including `t`, so the
exponent counts the action tokens strictly between `t` and `s` (observation tokens are bridged: they cost no
discount step). Within a chunk of `L` tokens the weight factors, `g^{K_s − J_t} = g^{K_s − L/2} · g^{L/2 − J_t}`,
so the chunk-local part is a scaled strict reverse cumulative sum: one `[·, L] @ [L, L]` matmul against a constant
0/1 triangle (the "segment sum" of state-space models) instead of an `L`-step loop. Both factors stay within
`g^{±L/2}`, so the scaling is exact in float32 while `g^{L/2}` stays far from underflow; `fits` says when it does.
Between chunks the state obeys the affine recurrence `H_k = E_k + g^{n_k}·H_{k+1}` on `[rows, T/L]` (`E_k` the
chunk's own contribution, `n_k` its action tokens), solved by a parallel (associative) scan over the chunk axis.
The in-chunk counts `K_t` are popcounts of the chunk's mask packed into one word (exact integers, elementwise).

The batch is processed in groups of whole rows (`lax.scan` over `[rows, T]` tiles, about 2 MB per float32 array) so
the intermediates of a group stay in cache; the advantages are the scan's stacked result, already in `[B, T]` order.
The returns `R = m·(A + V)` are computed after the loop, one elementwise pass over `[B, T]` that XLA drops where
nobody reads them (the learner's policy advantages); inside the loop they cost a second zero-filled stacked output.
`advantages_returns_and_moments` also returns the masked count, mean and centred sum of squares of `A` from the same
pass, so that whitening (`sao.core.advantages.whitened_gae`) reads `A` once more instead of three times.

`L = CHUNK = 32` by default (measured faster than 16: half the chunks, so half the per-chunk work and a shorter scan
over chunk boundaries; docs/history.md, 2026-11-30); `chunk=16` remains selectable, the kernel of earlier rounds, and
the tests use it as a second oracle.
"""
import jax
import jax.numpy as jnp

CHUNK = 32  # tokens per chunk; at most 32: a chunk's mask is packed into one uint32 word
CHUNKS = (4, 8, 16, 32)  # the chunk lengths the kernel takes: multiples of 4 (the mask is packed by nibbles), ≤ 32
# Largest |exponent| a factor takes is chunk/2; keep g^{±chunk/2} within 2^{±64} so that neither the factors nor
# their products with rewards and values below ~2^{58} in magnitude overflow or leave the normal float32 range.
_MAX_LOG2_SCALE = 64.0


def min_gamma_lambda(chunk: int = CHUNK) -> float:
  """The smallest `g = γλ` the kernel takes with chunks of `chunk` tokens: `2^{−64/(chunk/2)}` (1/16 for 32, ≈ 0.0039
  for 16); the largest is its reciprocal."""
  return 2.0 ** (-_MAX_LOG2_SCALE / (_checked_chunk(chunk) // 2))


def _checked_chunk(chunk):
  if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk not in CHUNKS:
    raise ValueError(f"chunk must be one of {CHUNKS}, got {chunk!r}")
  return chunk


G_MIN = min_gamma_lambda(CHUNK)  # 1/16
# Tokens per row group (rows × padded T): 2^19 float32 = 2 MB per array. Measured at 256×16384 on a 2-core x86 CPU:
# 32-row groups (2^19) 18.8 ms, 16 rows 19.5 ms, 2 rows 26 ms, the whole batch at once ~40 ms (CPU time, 16-token
# chunks); with 32-token chunks 16, 32 and 64 rows were within noise of each other.
_GROUP_TOKENS = 1 << 19


def fits(gamma_lam: jax.Array, mask: jax.Array, chunk: int = CHUNK) -> jax.Array:
  """Scalar bool: every sequence with an action token has `g_min ≤ g ≤ 1/g_min` (`g = γλ_b`, `[B]`,
  `g_min = min_gamma_lambda(chunk)`, 1/16 for the default chunk).

  Outside that range (λ = 0, γ = 0, γλ below 1/16) `g^{−L/2}` leaves the float32 range and the factored weights are
  not exact; callers use the scan there. Sequences without an action token have all-zero advantages whatever g.
  """
  return jnp.all(_in_range(gamma_lam, chunk) | ~jnp.any(mask, axis=-1))


def _in_range(gamma_lam, chunk):
  g_min = min_gamma_lambda(chunk)
  return (gamma_lam >= g_min) & (gamma_lam <= 1.0 / g_min)


def group_rows(batch: int, num_tokens: int) -> int:
  """Rows per group: the largest divisor of `batch` with `rows · T` at most `_GROUP_TOKENS` (at least 1)."""
  cap = max(1, _GROUP_TOKENS // max(num_tokens, 1))
  return max(d for d in range(1, min(batch, cap) + 1) if batch % d == 0)


def advantages_and_returns(rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: jax.Array,
                           gamma_lam: jax.Array, rows: int | None = None, chunk: int = CHUNK
                           ) -> tuple[jax.Array, jax.Array]:
  """`(A, R = A + V)`, both `[B, T]` and 0 where `m = 0`; exact when `fits(gamma_lam, mask, chunk)`.

  Args:
    rewards, values: `[B, T]` in the compute dtype.
    mask: `[B, T]` bool action mask.
    gamma: scalar γ.
    gamma_lam: `[B]` per-sequence `g = γ·λ_b`.
    rows: rows per group, a divisor of `B`; default `group_rows(B, T)`.
    chunk: tokens per chunk `L`, one of `CHUNKS` (static).
  """
  adv, ret, _ = _run(rewards, values, mask, gamma, gamma_lam, rows, chunk)
  return adv, ret


def advantages_returns_and_moments(rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: jax.Array,
                                   gamma_lam: jax.Array, rows: int | None = None, chunk: int = CHUNK
                                   ) -> tuple[jax.Array, jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
  """`(A, R, (n, mean, M2))`: `advantages_and_returns` plus the masked moments of `A`, from the same pass.

  `n = Σ m`, `mean = Σ m·A / n` and `M2 = Σ m·(A − mean)²` (scalars; mean = M2 = 0 when n = 0), so whitening
  needs one more read of `A` instead of three. Each row group's tile, still in cache, gives its own count, mean and
  centred sum of squares; the groups are merged with the parallel form of Chan et al.'s update,
  `M2 = Σ_g M2_g + Σ_g n_g·(mean_g − mean)²`, which never subtracts two large sums of squares (the one-pass
  `Σ A² − n·mean²` loses all float32 digits when |mean| ≫ std).
  """
  return _run(rewards, values, mask, gamma, gamma_lam, rows, chunk)


def _reverse_affine_scan(decay: jax.Array, add: jax.Array) -> jax.Array:
  """`x_k = add_k + decay_k · x_{k+1}` from `x_K = 0`, over the last axis, as a parallel scan (O(log K) depth).

  Each element is the map `x ↦ decay·x + add`; the map for `k..K−1` is the one for `k` after the one for
  `k+1..K−1`: (d₁, a₁) then (d₂, a₂) gives (d₁·d₂, a₂ + d₂·a₁), applied to `x_K = 0` it is the accumulated `add`.
  """
  def compose(later, earlier):
    d1, a1 = later
    d2, a2 = earlier
    return d1 * d2, a2 + d2 * a1

  return jax.lax.associative_scan(compose, (decay, add), reverse=True, axis=decay.ndim - 1)[1]


def _group(r, v, mb, gamma_lam, gamma):
  """One row group: `(A, (n, mean, M2))` for `[rows, C, L]` tiles and `[rows]` `g = γλ`."""
  length = r.shape[-1]
  half = length // 2
  dtype = r.dtype
  position = jnp.arange(length)
  bit = jnp.left_shift(jnp.uint32(1), position.astype(jnp.uint32))  # [L]: 2^t
  # K_t within the chunk, exactly: the chunk's mask as an L-bit word, then the set bits below t. Elementwise, so it
  # fuses into the exponential below (a [·, L] @ [L, L] matmul of the mask cost ~20 % of the kernel). The word is packed
  # in two levels, 4 tokens to a nibble, then the nibbles: one reduction over the 32-wide minor axis was slower on
  # XLA:CPU (~13 % of the kernel at 256×16384; docs/history.md, 2026-11-30). Bit t is token t on every platform.
  quads = mb.reshape(*mb.shape[:-1], length // 4, 4).astype(jnp.uint32)
  nibbles = jnp.sum(quads << jnp.arange(4, dtype=jnp.uint32), axis=-1, dtype=jnp.uint32)  # [rows, C, L/4]
  bits = jnp.sum(nibbles << (4 * jnp.arange(length // 4, dtype=jnp.uint32)), axis=-1, dtype=jnp.uint32)  # [rows, C]
  # Rows without an action token have all-zero advantages whatever g, and when `fits` is false the caller discards
  # this result (under `vmap` a `lax.cond` computes both branches): g = 1 there keeps every intermediate finite
  # (log 0 would put inf and NaN into the discarded branch).
  gamma_lam = jnp.where(_in_range(gamma_lam, length) & jnp.any(bits != 0, axis=-1), gamma_lam, 1.0).astype(dtype)
  log_g = jnp.log(gamma_lam)[:, None]  # [rows, 1]
  g3, log_g3 = gamma_lam[:, None, None], log_g[:, :, None]
  actions_before = jax.lax.population_count(bits[..., None] & (bit - 1)).astype(dtype)  # K_t, [rows, C, L]
  actions_through = jax.lax.population_count(bits[..., None] & (2 * bit - 1)).astype(dtype)  # J_t = K_t + m_t
  chunk_actions = jax.lax.population_count(bits).astype(dtype)  # n_k, [rows, C]
  # x_s = g^{K_s − L/2}·e_s on action tokens, e_s = γ·V_s + g·(r_s − V_s) written as g·r_s + (γ − g)·V_s so that no
  # [rows, T] intermediate is shared with the advantage below (XLA:CPU would materialise it: one more pass);
  # `where`, not a product, so observation tokens' values never leak.
  x = jnp.where(mb, jnp.exp((actions_before - half) * log_g3) * (g3 * r + (gamma - g3) * v), 0.0)
  later = (position[:, None] > position[None, :]).astype(dtype)  # [s, t] = 1 where s > t
  after_sum = jnp.matmul(x.reshape(-1, length), later,  # Σ_{s>t} x_s within the chunk; float32 even where the
                         precision=jax.lax.Precision.HIGHEST).reshape(x.shape)  # default matmul precision is not
  entering_left = jnp.exp(half * log_g) * jnp.sum(x, axis=-1)  # E_k = Σ_s g^{K_s}·e_s, [rows, C]
  # H_k = E_k + g^{n_k}·H_{k+1} over chunks, right to left; chunk k sees H_{k+1}.
  state = _reverse_affine_scan(jnp.exp(chunk_actions * log_g), entering_left)
  from_right = jnp.concatenate([state[:, 1:], jnp.zeros_like(state[:, :1])], axis=1)
  from_right = from_right * jnp.exp((chunk_actions - half) * log_g)  # g^{n_k − L/2}·H_{k+1}
  h = jnp.exp((half - actions_through) * log_g3) * (after_sum + from_right[..., None])
  a = jnp.where(mb, r - v + h, 0.0)
  # The tile is in cache: its own mean first, then the centred squares.
  count = jnp.sum(chunk_actions)
  mean = jnp.sum(a) / jnp.maximum(count, 1.0)
  sum_sq = jnp.sum(jnp.where(mb, jnp.square(a - mean), 0.0))
  return a, (count, mean, sum_sq)


def _run(rewards, values, mask, gamma, gamma_lam, rows, chunk):
  chunk = _checked_chunk(chunk)
  batch, num_tokens = rewards.shape
  dtype = rewards.dtype
  if num_tokens == 0 or batch == 0:
    zero = jnp.zeros((), dtype)
    return jnp.zeros_like(rewards), jnp.zeros_like(rewards), (zero, zero, zero)
  padded = -(-num_tokens // chunk) * chunk
  rows = group_rows(batch, padded) if rows is None else rows
  if not (isinstance(rows, int) and rows > 0 and batch % rows == 0):
    raise ValueError(f"rows must be a positive divisor of the batch size {batch}, got {rows!r}")
  inputs = (rewards, values, mask)
  if padded > num_tokens:  # trailing observation tokens change nothing: they are bridged and their rewards ignored
    inputs = tuple(jnp.pad(x, ((0, 0), (0, padded - num_tokens))) for x in inputs)
  groups = batch // rows
  tiles = [x.reshape(groups, rows, padded // chunk, chunk) for x in inputs]

  def step(_, xs):
    return None, _group(*xs, gamma)

  _, (adv, (counts, means, sums_sq)) = jax.lax.scan(step, None, (*tiles, gamma_lam.reshape(groups, rows)))
  count = jnp.sum(counts)
  mean = jnp.sum(counts * means) / jnp.maximum(count, 1.0)
  sum_sq = jnp.sum(sums_sq) + jnp.sum(counts * jnp.square(means - mean))
  adv = adv.reshape(batch, padded)[:, :num_tokens]
  # Outside the loop: as a stacked output R was one more zero-filled [B, T] buffer written twice (measured slower,
  # docs/history.md, 2026-11-30), and here XLA drops the pass where R is unused.
  return adv, jnp.where(mask, adv + values, 0.0), (count, mean, sum_sq)
