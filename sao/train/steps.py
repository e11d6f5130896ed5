"""Jit-sharded actor and critic steps: `(state, batch, rng) -> (state, metrics)`, with exact gradient accumulation.

A step splits the `[B, …]` batch into `M = B / micro_batch_size` micro-batches (row `i·M + m` goes to micro-batch
`m`, so every data shard holds an equal slice of every micro-batch) and runs them through a `lax.scan` that sums the
gradients of each micro-batch's *unnormalised* `loss_sum`. Dividing once by the full-batch denominator `N` gives

    ∇L = (1/N) Σ_m ∇loss_sum_m,

exactly the full-batch gradient (`N` = action tokens for token-mean losses, valid sequences for GSPO). Gradients
are taken only w.r.t. trainable parameters; frozen ones get a zero update from the optimizer (`sao.train.optim`).
The actor's loss, the batch keys it reads and its denominator come from the registry `sao.train.actor_losses`; the
per-micro-batch metrics are `clu.metrics` (numerator and count) merged in the scan and divided once at the end.

NaN guard: if the loss or the gradient norm is non-finite, the new params and optimizer state are discarded inside
the jitted step (`jnp.where` on every leaf), the step counter does not advance, and `metrics["skipped"] = 1`.

Alignment: `logprobs[:, t] = log π(x_t | x_<t)`. Critic values are aligned the same way — `values[:, t]` is the
critic's output at position `t − 1`, the value of the state *before* token `t` is chosen (0 at `t = 0`). A value read
at position `t` would have seen the action `x_t` and become an action-dependent (biased) baseline.
"""
from __future__ import annotations

import collections
import functools
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import optax
from clu import metrics as clu_metrics
from jax.sharding import Mesh

from sao.core import losses
from sao.models.config import ModelConfig
from sao.models.logprobs import token_logprobs
from sao.models.transformer import Critic
from sao.train import actor_losses
from sao.train import config as config_lib
from sao.train import critic_stats
from sao.train import mesh as mesh_lib
from sao.train import optim
from sao.train.actor_losses import Mean
from sao.train.mesh_jit import MeshJit
from sao.train.micro_batching import MicroBatching

STEP_METRICS = ("loss", "grad_norm", "l2_params", "l2_updates", "skipped", "step", "tokens")  # every step reports
CRITIC_KEYS = ("input_ids", "attention_mask", "action_mask", "returns", "old_values")
# How many times each step kind has been traced (Python side effect: runs at trace time only). A count that grows
# across steps with one padded shape means a recompilation.
TRACE_COUNTS: collections.Counter = collections.Counter()


@flax.struct.dataclass
class TrainState:
  """One role's state. `step`: applied updates (int32 scalar; drives the LR schedule); `skipped`: updates the NaN
  guard discarded (int32 scalar)."""
  step: jax.Array
  params: Any
  opt_state: Any
  skipped: jax.Array


def select(batch: dict[str, Any], keys: tuple[str, ...], where: str) -> dict[str, Any]:
  """`{k: batch[k] for k in keys}`; a missing key is a ValueError naming it."""
  missing = [k for k in keys if k not in batch]
  if missing:
    raise ValueError(f"{where}: batch is missing {missing}")
  return {k: batch[k] for k in keys}


def num_micro_batches(shape: tuple[int, ...], micro_batch_size: int | MicroBatching) -> int:
  """Micro-batches of a `[B, T, …]` batch: B / rows, rows = `micro_batch_size` or, per length T, the
  `MicroBatching`'s (`sao.train.micro_batching`); rows 0 = one micro-batch."""
  batch_size, length = shape[0], shape[1]
  rows = micro_batch_size.rows(length) if isinstance(micro_batch_size, MicroBatching) else micro_batch_size
  if rows <= 0:
    return 1
  if batch_size % rows:
    raise ValueError(f"batching: micro-batches of {rows} rows (at length {length}) do not divide the batch size "
                     f"{batch_size}")
  return batch_size // rows


def split_micro(tree: Any, num_micro: int) -> Any:
  """`[B, …]` → `[M, B/M, …]` with row `i·M + m` in micro-batch `m` (keeps each shard's rows on its device)."""
  return jax.tree.map(lambda x: x.reshape(x.shape[0] // num_micro, num_micro, *x.shape[1:]).swapaxes(0, 1), tree)


def merge_micro(tree: Any) -> Any:
  """Inverse of `split_micro`: `[M, b, …]` → `[b·M, …]`."""
  return jax.tree.map(lambda x: x.swapaxes(0, 1).reshape(-1, *x.shape[2:]), tree)


def _constrain(tree: Any, mesh: Mesh) -> Any:
  return jax.lax.with_sharding_constraint(tree, mesh_lib.batch_sharding(mesh))


def policy_logprobs(params, model_config: ModelConfig, batch, temperature: float, chunk: int):
  """(logprobs, entropy), both `[B, T]` float32, aligned with the scored token; with the batch's `routed_experts`
  `[B, T, L, k]` (MoE routing replay) each recorded token is routed to the engine's experts."""
  return token_logprobs(params, model_config, batch["input_ids"], batch["attention_mask"], temperature, chunk,
                        return_entropy=True, routed_experts=batch.get("routed_experts"))


def critic_values_fn(params, model_config: ModelConfig, batch) -> jax.Array:
  """Values `[B, T]` float32 with `values[:, t] = V(x_<t)` = critic output at `t − 1`; 0 at `t = 0`."""
  raw = Critic(model_config).apply({"params": params}, batch["input_ids"], batch["attention_mask"])
  return jnp.pad(raw[:, :-1], ((0, 0), (1, 0)))


def _merge(trainable: Any, frozen: Any) -> Any:
  return jax.tree.map(lambda a, b: b if a is None else a, trainable, frozen, is_leaf=lambda x: x is None)


def partition_params(params: Any, mask: Any) -> tuple[Any, Any]:
  return (jax.tree.map(lambda p, m: p if m else None, params, mask),
          jax.tree.map(lambda p, m: None if m else p, params, mask))


def actor_micro_loss(loss: actor_losses.ActorLoss, hparams: dict, model_config: ModelConfig, temperature: float,
                      chunk: int):
  """A function `(params, micro_batch) -> (loss_sum, metrics)` whose `metrics` (clu) merge over micro-batches."""

  def fn(params, mb):
    lp, ent = policy_logprobs(params, model_config, mb, temperature, chunk)
    mask = mb["action_mask"].astype(bool)
    tokens = jnp.sum(mask, dtype=jnp.float32)
    metrics = {"entropy": Mean(total=jnp.sum(jnp.where(mask, ent, 0.0)), count=tokens)}
    if loss.reads_rollout_logprobs:
      log_ratio = jnp.where(mask, jax.lax.stop_gradient(lp) - mb["rollout_logprobs"], 0.0)  # log π_θ/π_rollout
      metrics["logprob_mismatch"] = Mean(total=jnp.sum(jnp.abs(log_ratio)), count=tokens)
      metrics["mismatch_kl_k3"] = Mean(total=jnp.sum(jnp.where(mask, jnp.expm1(log_ratio) - log_ratio, 0.0)),
                                       count=tokens)
    loss_sum, loss_metrics = loss.fn(lp, mb, **hparams)
    clashes = set(metrics) & set(loss_metrics)
    if clashes:
      raise ValueError(f"actor loss {loss.name!r}: metric names {sorted(clashes)} are reserved by the step")
    return loss_sum, {**metrics, **loss_metrics}

  return fn


def critic_micro_loss(model_config: ModelConfig, value_clip: float):
  def fn(params, mb):
    values = critic_values_fn(params, model_config, mb)
    clip = value_clip if value_clip > 0 else None
    _, aux = losses.value_loss(values, mb["returns"], mb["action_mask"], mb["old_values"], clip)
    mask = mb["action_mask"].astype(bool)
    tokens = jnp.sum(mask, dtype=jnp.float32)
    metrics = {"value_mean": Mean(total=jnp.sum(jnp.where(mask, jax.lax.stop_gradient(values), 0.0)), count=tokens),
               **critic_stats.step_metrics(values, mb["returns"], mask)}  # epoch 0's: the pre-update diagnostics
    if clip is not None:
      metrics["clip_fraction"] = Mean(total=aux["clip_count"], count=tokens)
    return aux["loss_sum"], metrics

  return fn


def _where_tree(pred, new, old):
  return jax.tree.map(lambda n, o: jnp.where(pred, n, o), new, old)


def _is_metric(x: Any) -> bool:
  return isinstance(x, clu_metrics.Metric)


def _merge_metrics(a: dict, b: dict) -> dict:
  return jax.tree.map(lambda x, y: x.merge(y), a, b, is_leaf=_is_metric)


def check_metric_names(micro_loss: Callable, kind: str, params: Any, micro_batch: dict) -> Any:
  """The micro-batch loss's metric shapes (clu metrics of scalars); a name clashing with `STEP_METRICS` is an
  error."""
  _, metrics_shape = jax.eval_shape(micro_loss, params, micro_batch)
  reserved = set(metrics_shape) & set(STEP_METRICS)
  if reserved:
    raise ValueError(f"{kind} loss: metric names {sorted(reserved)} are the step's own ({STEP_METRICS})")
  return metrics_shape


def zero_carry(metrics_shape: Any, train_params: Any) -> tuple[Any, jax.Array, Any]:
  """The accumulator `(grad_sum, loss_sum, metrics)` before any micro-batch: zeros. Gradients accumulate in float32
  whatever the param dtype (bf16 sums over micro-batches would lose bits)."""
  return (jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), train_params), jnp.zeros((), jnp.float32),
          jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metrics_shape))


def accumulate_grads(micro_loss: Callable, trainable: Any, micro_batch_size: int | MicroBatching, mesh: Mesh, params: Any, batch: dict,
                carry: tuple[Any, jax.Array, Any]) -> tuple[Any, jax.Array, Any]:
  """Adds the batch's `(Σ_m ∇loss_sum_m, Σ_m loss_sum_m, merged metrics)` to `carry`, one micro-batch at a time."""
  num_micro = num_micro_batches(batch["input_ids"].shape, micro_batch_size)
  train_params, frozen_params = partition_params(params, trainable)

  def body(carry, mb):
    grad_acc, loss_acc, metrics_acc = carry
    mb = _constrain(mb, mesh)
    loss_fn = lambda tp: micro_loss(_merge(tp, frozen_params), mb)
    (loss_sum, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(train_params)
    grad_acc = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grad_acc, grads)
    return (grad_acc, loss_acc + loss_sum, _merge_metrics(metrics_acc, metrics)), None

  carry, _ = jax.lax.scan(body, carry, split_micro(batch, num_micro))
  return carry


def apply_grads(tx: optax.GradientTransformation, trainable: Any, state: TrainState, carry: tuple[Any, jax.Array, Any],
           denominator: jax.Array, tokens: jax.Array) -> tuple[TrainState, dict]:
  """`∇L = grad_sum / N` → clip/AdamW → NaN guard → metrics (`tokens`: the batch's action tokens)."""
  grad_sum, loss_sum, micro_metrics = carry
  _, frozen_params = partition_params(state.params, trainable)
  grads = jax.tree.map(lambda g: g / denominator, grad_sum)
  loss = loss_sum / denominator
  grad_norm = optax.global_norm(grads)
  full_grads = _merge(grads, jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), frozen_params))
  updates, opt_state = tx.update(full_grads, state.opt_state, state.params)
  params = optim.apply_updates(state.params, updates, opt_state)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  new_state = TrainState(
      step=state.step + finite.astype(jnp.int32),
      params=_where_tree(finite, params, state.params),
      opt_state=_where_tree(finite, opt_state, state.opt_state),
      skipped=state.skipped + (~finite).astype(jnp.int32))
  applied = jax.tree.map(lambda a, b: a.astype(jnp.float32) - b.astype(jnp.float32), new_state.params, state.params)
  metrics = {
      "loss": loss,
      "grad_norm": grad_norm,
      "l2_params": optax.global_norm(new_state.params),
      "l2_updates": optax.global_norm(applied),
      "skipped": (~finite).astype(jnp.int32),
      "step": new_state.step,
      "tokens": tokens,
      **{name: m.compute() for name, m in micro_metrics.items()},
  }
  return new_state, metrics


def _make_step(micro_loss: Callable, kind: str, denominator_fn: Callable[[jax.Array], jax.Array],
               tx: optax.GradientTransformation, trainable: Any, micro_batch_size: int | MicroBatching, mesh: Mesh):
  """The shared step body: micro-batch scan → exact mean gradient → clip/AdamW → NaN guard → metrics."""

  def step(state: TrainState, batch: dict, rng: jax.Array) -> tuple[TrainState, dict]:
    del rng  # no stochastic layers yet; kept so every step has the same signature
    TRACE_COUNTS[kind] += 1
    num_micro = num_micro_batches(batch["input_ids"].shape, micro_batch_size)
    metrics_shape = check_metric_names(micro_loss, kind, state.params,
                                        jax.tree.map(lambda x: x[0], split_micro(batch, num_micro)))
    carry = zero_carry(metrics_shape, partition_params(state.params, trainable)[0])
    carry = accumulate_grads(micro_loss, trainable, micro_batch_size, mesh, state.params, batch, carry)
    tokens = jnp.sum(batch["action_mask"].astype(bool), dtype=jnp.float32)
    return apply_grads(tx, trainable, state, carry, denominator_fn(batch["action_mask"]), tokens)

  return step


def _jit_step(step, state_shardings, mesh, name: str) -> MeshJit:
  batch_sharding = mesh_lib.batch_sharding(mesh)  # a prefix: dim 0 of every batch array
  rep = mesh_lib.replicated(mesh)
  return MeshJit(step, mesh, name=name, in_shardings=(state_shardings, batch_sharding, rep),
                 out_shardings=(state_shardings, rep), donate_argnums=(0,))


def make_actor_step(kind: str, model_config: ModelConfig, tx: optax.GradientTransformation, trainable: Any,
                    state_shardings: Any, mesh: Mesh, *, micro_batch_size: int | MicroBatching = 0, temperature: float = 1.0,
                    logprob_chunk_size: int = 128, hparams: dict[str, Any] | None = None) -> Callable:
  """Jitted `actor_step(state, batch, rng) -> (state, metrics)` for the registered actor loss `kind`.

  `batch` must hold exactly `actor_losses.get(kind).batch_keys` (`[B, T]`; `seq_advantages` `[B]`), `B` a multiple
  of the batch shards × micro-batches. `hparams`: the loss's hyper-parameters (`actor_losses.get(kind).hparams(
  learner_config)`; None: those of `default_learner_config()`). Metrics (replicated scalars): loss, grad_norm
  (before clipping), l2_params, l2_updates, skipped, step, tokens, entropy (masked mean over action tokens), for
  losses that read rollout log-probs logprob_mismatch (`mean_m |logp − logp_rollout|`) and mismatch_kl_k3
  (`mean_m (r − 1) − log r`, `r = π_θ/π_rollout`), and the loss's own metrics (dis: dis_masked_fraction; gspo:
  clip_fraction over sequences; ppo_clip: over tokens). The state is donated.
  """
  loss = actor_losses.get(kind)
  if hparams is None:
    hparams = loss.hparams(config_lib.default_learner_config())
  micro_loss = actor_micro_loss(loss, dict(hparams), model_config, temperature, logprob_chunk_size)
  step = _make_step(micro_loss, kind, loss.denominator, tx, trainable, micro_batch_size, mesh)
  return _jit_step(step, state_shardings, mesh, f"actor_step[{kind}]")


def make_critic_step(model_config: ModelConfig, tx: optax.GradientTransformation, trainable: Any,
                     state_shardings: Any, mesh: Mesh, *, micro_batch_size: int | MicroBatching = 0,
                     value_clip: float = 0.0) -> Callable:
  """Jitted `critic_step(state, batch, rng) -> (state, metrics)` minimising `(1/N) Σ m·½(V − R)²`.

  `batch` holds `CRITIC_KEYS` (`returns`, `old_values` `[B, T]`; old_values only matter when `value_clip > 0`).
  Metrics: loss, grad_norm, l2_params, l2_updates, skipped, step, tokens, value_mean (+ clip_fraction), and the
  `critic_stats.PREFIX` sums of the values this step's forward saw (`sao.train.critic_stats`).
  """
  step = _make_step(critic_micro_loss(model_config, value_clip), "value", actor_losses.token_count, tx, trainable,
                    micro_batch_size, mesh)
  return _jit_step(step, state_shardings, mesh, "critic_step")


def _micro_map(fn, params, batch, micro_batch_size: int | MicroBatching, mesh: Mesh):
  num_micro = num_micro_batches(batch["input_ids"].shape, micro_batch_size)
  out = jax.lax.map(lambda mb: fn(params, _constrain(mb, mesh)), split_micro(batch, num_micro))
  return merge_micro(out)


def make_critic_values(model_config: ModelConfig, param_shardings: Any, mesh: Mesh,
                       micro_batch_size: int | MicroBatching = 0) -> Callable:
  """Jitted `critic_values(params, batch) -> values [B, T]` (aligned as in the module docstring), forward only,
  one micro-batch at a time. `batch`: input_ids, attention_mask `[B, T]`."""
  fn = functools.partial(critic_values_fn, model_config=model_config)
  sharding = mesh_lib.batch_sharding(mesh)
  return MeshJit(lambda params, batch: _micro_map(lambda p, b: fn(p, batch=b), params, batch, micro_batch_size, mesh),
                 mesh, name="critic_values", in_shardings=(param_shardings, sharding), out_shardings=sharding)


def make_actor_logprobs(model_config: ModelConfig, param_shardings: Any, mesh: Mesh, micro_batch_size: int | MicroBatching = 0,
                        temperature: float = 1.0, logprob_chunk_size: int = 128) -> Callable:
  """Jitted `actor_logprobs(params, batch) -> (logprobs [B, T], entropy [B, T])`, forward only."""
  sharding = mesh_lib.batch_sharding(mesh)
  fn = lambda p, b: policy_logprobs(p, model_config, b, temperature, logprob_chunk_size)
  return MeshJit(lambda params, batch: _micro_map(fn, params, batch, micro_batch_size, mesh), mesh,
                 name="actor_logprobs", in_shardings=(param_shardings, sharding), out_shardings=sharding)
