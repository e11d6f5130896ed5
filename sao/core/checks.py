"""Trace-time argument checks shared by the math core.

Every check runs on static shapes and dtypes, so under `jit` it fires once, at trace time, with a `ValueError` that
names the offending argument. Nothing here touches array values.
"""
from typing import Sequence

import jax.numpy as jnp
import numpy as np


def compute_dtype(*arrays) -> jnp.dtype:
  """The dtype statistics are computed in: float32, or float64 when an input already is float64 (x64 mode)."""
  dtype = jnp.dtype(jnp.float32)
  for a in arrays:
    if jnp.issubdtype(jnp.asarray(a).dtype, jnp.floating):
      dtype = jnp.promote_types(dtype, jnp.asarray(a).dtype)
  return dtype


def float_array(name: str, x, ndim: int | None = None):
  """Returns `x` as an array after checking it is floating point (float16/bfloat16/float32/float64)."""
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"{name} must be a floating-point array, got dtype {x.dtype}")
  if ndim is not None and x.ndim != ndim:
    raise ValueError(f"{name} must have {ndim} dimensions, got shape {x.shape}")
  return x


def mask_array(name: str, x, ndim: int | None = None):
  """Returns a boolean mask after checking `x` is bool or integer.

  Float masks are rejected on purpose: a float "mask" can silently carry weights other than 0/1.
  """
  x = jnp.asarray(x)
  if not (x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.integer)):
    raise ValueError(f"{name} must be a bool or integer mask, got dtype {x.dtype}")
  if ndim is not None and x.ndim != ndim:
    raise ValueError(f"{name} must have {ndim} dimensions, got shape {x.shape}")
  return x.astype(jnp.bool_) if x.dtype != jnp.bool_ else x


def same_shape(names: Sequence[str], arrays: Sequence) -> None:
  """Raises if the arrays' shapes differ, naming the first argument that disagrees with `names[0]`."""
  ref = np.shape(arrays[0])
  for name, a in zip(names[1:], arrays[1:]):
    if np.shape(a) != ref:
      raise ValueError(f"{name} has shape {np.shape(a)} but {names[0]} has shape {ref}")


def per_sequence(name: str, x, batch: int, dtype):
  """A scalar or `[B]` per-sequence parameter, returned as a `[B, 1]` array of `dtype` for broadcasting."""
  x = jnp.asarray(x, dtype=dtype)
  if x.ndim == 0:
    return jnp.broadcast_to(x, (batch, 1))
  if x.shape != (batch,):
    raise ValueError(f"{name} must be a scalar or have shape [B]=({batch},), got shape {x.shape}")
  return x[:, None]
