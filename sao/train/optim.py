"""Optimizers per role: AdamW behind global-norm clipping, LR warmup then constant/cosine, frozen params by regex.

Frozen parameters (`frozen_params` regexes matched with `re.fullmatch` against the slash-joined param path, e.g.
`model/layers_0/self_attn/q_proj/kernel`) go through `optax.set_to_zero()` inside `optax.multi_transform`: they get a
zero update and the Adam moments exist only for trainable leaves (the inner transform sees `MaskedNode`s), so a
frozen 35B-A3B attention stack costs no optimizer memory. Clipping uses the global norm of the trainable gradients.

Precision (`float32_optimizer`): the AdamW moments are float32 whatever the param dtype, and the gradients reach
them in float32. With `optimizer.master_weights` the trainable params also have a float32 master copy in the
optimizer state: the update is applied to the master, and the params (e.g. bf16) become its cast
(`apply_updates`), so updates smaller than the param dtype's spacing accumulate instead of rounding away.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging

TRAINABLE, FROZEN = "trainable", "frozen"


def param_path(path) -> str:
  """`model/layers_0/self_attn/q_proj/kernel` from a jax key path."""
  parts = []
  for k in path:
    parts.append(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))))
  return "/".join(parts)


def param_labels(params: Any, frozen_patterns: Sequence[str]) -> Any:
  """A tree like `params` with `"frozen"` where any pattern fully matches the param path, else `"trainable"`."""
  compiled = [re.compile(p) for p in frozen_patterns]

  def label(path, _):
    name = param_path(path)
    return FROZEN if any(c.fullmatch(name) for c in compiled) else TRAINABLE

  return jax.tree_util.tree_map_with_path(label, params)


@dataclasses.dataclass(frozen=True)
class ParamCounts:
  trainable: int
  frozen: int


def count_params(params: Any, labels: Any) -> ParamCounts:
  """Number of trainable and frozen scalars (works on abstract `ShapeDtypeStruct` trees)."""
  counts = {TRAINABLE: 0, FROZEN: 0}
  for leaf, label in zip(jax.tree.leaves(params), jax.tree.leaves(labels)):
    counts[label] += int(np.prod(leaf.shape))
  return ParamCounts(counts[TRAINABLE], counts[FROZEN])


def learning_rate_schedule(opt: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warmup `0 → lr` over `warmup_steps`, then constant, or cosine to `end_lr_fraction·lr` at `total_steps`.

  `lr(s) = lr·(s+1)/W` for `s < W` (the first update already moves); constant: `lr`; cosine:
  `lr·(f + (1−f)·½(1 + cos(π·(s−W)/(S−W))))`.
  With `S ≤ W` (a run shorter than its warmup) the cosine spans one step: `S − W` is taken as at least 1.
  """
  lr = float(opt.learning_rate)
  warmup = int(opt.warmup_steps)
  if opt.schedule == "constant":
    after = optax.constant_schedule(lr)
  elif opt.schedule == "cosine":
    after = optax.cosine_decay_schedule(lr, decay_steps=max(int(opt.total_steps) - warmup, 1),
                                        alpha=float(opt.end_lr_fraction))
  else:
    raise ValueError(f"optimizer.schedule: must be 'constant' or 'cosine', got {opt.schedule!r}")
  if warmup == 0:
    return after
  warmup_fn = lambda count: lr * (count + 1) / warmup
  return optax.join_schedules([warmup_fn, after], [warmup])


def make_optimizer(opt: ml_collections.ConfigDict, params: Any, frozen_patterns: Sequence[str],
                   role: str = "") -> tuple[optax.GradientTransformation, Any, ParamCounts]:
  """Builds the role's optimizer.

  Args:
    opt: `config.<role>.optimizer`.
    params: the role's params (concrete or abstract); only paths and shapes are read.
    frozen_patterns: regexes of frozen param paths.
    role: name used in the log line.

  Returns:
    `(tx, labels, counts)`: the transformation, the `"trainable"/"frozen"` label tree, and parameter counts.
  """
  labels = param_labels(params, frozen_patterns)
  counts = count_params(params, labels)
  if counts.trainable == 0:
    raise ValueError(f"{role}.frozen_params: every parameter is frozen ({frozen_patterns})")
  logging.info("%s optimizer: %d trainable, %d frozen parameters (frozen patterns %s)", role or "model",
               counts.trainable, counts.frozen, list(frozen_patterns))
  # Decoupled weight decay on matrices only: decaying norm scales and biases toward 0 is not regularisation.
  # A callable mask: multi_transform hands the inner chain a tree with `MaskedNode`s in place of frozen leaves.
  decay_mask = lambda tree: jax.tree.map(lambda p: p.ndim >= 2, tree)
  inner = []
  if opt.clip_norm > 0:
    inner.append(optax.clip_by_global_norm(float(opt.clip_norm)))
  inner.append(optax.adamw(learning_rate_schedule(opt), b1=float(opt.b1), b2=float(opt.b2), eps=float(opt.eps),
                           weight_decay=float(opt.weight_decay), mask=decay_mask))
  trainable = float32_optimizer(optax.chain(*inner), master_weights=bool(opt.get("master_weights", False)))
  tx = optax.multi_transform({TRAINABLE: trainable, FROZEN: optax.set_to_zero()}, labels)
  return tx, labels, counts


class MasterWeightsState(NamedTuple):
  """`master`: float32 copy of the trainable params (`optax.MaskedNode` where frozen); `inner`: the wrapped
  optimizer's state, built on the master copy (so float32)."""
  master: Any
  inner: Any


def _float32(tree: Any) -> Any:
  return jax.tree.map(lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def float32_optimizer(inner: optax.GradientTransformation, master_weights: bool) -> optax.GradientTransformation:
  """`inner` run in float32 for params of any dtype: its state (AdamW moments) is float32 and it sees float32
  gradients and params. Updates come back in float32; `apply_updates` adds them to the params.

  With `master_weights`, the state is a `MasterWeightsState`: `master ← master + inner update` in float32, and
  `apply_updates` sets the params to `master.astype(param dtype)`. For float32 params without master weights this
  is `inner` itself (the toy runs are unchanged)."""

  def init(params):
    if not master_weights:
      return inner.init(_float32(params))
    master = _float32(params)
    return MasterWeightsState(master=master, inner=inner.init(master))

  def update(grads, state, params=None):
    grads = _float32(grads)
    if not master_weights:
      return inner.update(grads, state, None if params is None else _float32(params))
    updates, inner_state = inner.update(grads, state.inner, state.master)
    master = optax.apply_updates(state.master, updates)
    return updates, MasterWeightsState(master=master, inner=inner_state)

  return optax.GradientTransformation(init, update)


def _is_master(x: Any) -> bool:
  return isinstance(x, MasterWeightsState)


def apply_updates(params: Any, updates: Any, opt_state: Any) -> Any:
  """New params after `tx.update` returned (`updates`, `opt_state`): `params + updates` in each param's dtype, except
  where `opt_state` holds a float32 master copy (`MasterWeightsState`): there the params are the master's cast."""
  new = optax.apply_updates(params, updates)
  masters = [x.master for x in jax.tree.leaves(opt_state, is_leaf=_is_master) if _is_master(x)]
  for master in masters:  # one per multi_transform label that keeps master weights; MaskedNode elsewhere
    new = jax.tree.map(lambda m, p: p if isinstance(m, optax.MaskedNode) else m.astype(p.dtype), master, new,
                       is_leaf=lambda x: isinstance(x, optax.MaskedNode))
  return new


def trainable_mask(labels: Any) -> Any:
  """Bool tree, True on trainable leaves."""
  return jax.tree.map(lambda label: label == TRAINABLE, labels)
