"""Skip-observation GAE as one pass over the tokens on the CPU: the native kernel `gae_cpu.cc`, called from JAX.

`advantages_returns_and_moments` is `sao.core.gae_chunked.advantages_returns_and_moments` for float32 on XLA:CPU,
exact for every `g = γλ` (λ = 0 and γλ below 1/16 included: no rescaling, so no `fits` range) and at memory speed:
rewards, values and the mask are read once, the advantages and returns written once, and each row's masked count,
mean and centred sum of squares of `A` come out of the same pass (docs/performance_learner.md, "GAE + whitening"). The
arithmetic is `sao.core.advantages.gae`'s recursion, regrouped eight tokens at a time (the kernel's header), so it
agrees with the scan to float32 rounding. Only XLA:CPU runs it: `sao.core.advantages` picks it per platform
(`jax.lax.platform_dependent`), other platforms and float64 run the XLA formulations.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from sao.kernels import build

NAME = "gae_cpu"
TARGET = "sao_gae_f32"
_TARGETS = {TARGET: "SaoGaeF32"}


def available() -> bool:
  """Whether the kernel is built and registered on this host (building it on first call; `sao.kernels.build`
  says when a failed build is an error)."""
  return build.available(NAME, _TARGETS)


def advantages_returns_and_moments(rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: jax.Array,
                                   gamma_lam: jax.Array, with_returns: bool = True
                                   ) -> tuple[jax.Array, jax.Array | None, jax.Array]:
  """`(A, R, moments)` of skip-observation GAE on XLA:CPU.

  Args:
    rewards, values: `[..., T]` float32.
    mask: `[..., T]` bool action mask.
    gamma: scalar or `[...]` discount γ.
    gamma_lam: `[...]` per-sequence `g = γ·λ_b`.
    with_returns: whether to write `R` (static); without it the kernel skips the writes and `R` is None.

  Returns:
    `A` and `R = m·(A + V)`, `[..., T]` float32, 0 where `m = 0` (`R` None unless `with_returns`), and `[..., 3]`
    float32 per-row `(n, mean, M2)` of `A` over the mask (`n = Σ m`, `M2 = Σ m·(A − mean)²`, mean = M2 = 0 when
    n = 0), for `merge_row_moments`.
  """
  load()
  if rewards.ndim < 1:
    raise ValueError("gae_cpu: rewards must be [..., T], got a scalar")
  lead = rewards.shape[:-1]
  for name, x, dtype in (("rewards", rewards, jnp.float32), ("values", values, jnp.float32),
                         ("mask", mask, jnp.bool_)):
    if x.dtype != dtype or x.shape != rewards.shape:
      raise ValueError(f"gae_cpu: {name} must be {jnp.dtype(dtype).name} {rewards.shape}, got {x.dtype} {x.shape}")
  gamma = jnp.broadcast_to(jnp.asarray(gamma, jnp.float32), lead)
  gamma_lam = jnp.asarray(gamma_lam, jnp.float32)
  if gamma_lam.shape != lead:
    raise ValueError(f"gae_cpu: gamma_lam must be {lead}, got {gamma_lam.shape}")
  if 0 in rewards.shape:  # nothing to compute
    zeros = jnp.zeros(rewards.shape, jnp.float32)
    return zeros, zeros if with_returns else None, jnp.zeros((*lead, 3), jnp.float32)
  tokens = jax.ShapeDtypeStruct(rewards.shape, jnp.float32)
  outputs = (tokens, tokens if with_returns else jax.ShapeDtypeStruct((0,), jnp.float32),
             jax.ShapeDtypeStruct((*lead, 3), jnp.float32))
  # Leading dims are rows to the kernel, so a vmapped call is one call over the stacked rows.
  advantages, returns, moments = jax.ffi.ffi_call(TARGET, outputs, vmap_method="broadcast_all")(
      rewards, values, mask, gamma, gamma_lam)
  return advantages, returns if with_returns else None, moments


def merge_row_moments(moments: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`(n, mean, M2)` over all rows from `[..., 3]` per-row moments, by the parallel form of Chan et al.'s update
  (`sao.core.masked.merge_moments`): `n = Σ n_b`, `mean = Σ n_b·mean_b / n`, `M2 = Σ M2_b + Σ n_b·(mean_b − mean)²`.
  """
  count, means, m2 = (moments[..., i].reshape(-1) for i in range(3))
  n = jnp.sum(count)
  mean = jnp.sum(count * means) / jnp.maximum(n, 1.0)
  return n, mean, jnp.sum(m2) + jnp.sum(count * jnp.square(means - mean))


def load() -> None:
  """Builds and registers the kernel; BuildError (`sao.kernels.build`) when it cannot."""
  build.load(NAME, _TARGETS)
