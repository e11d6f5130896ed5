"""One training step over a batch cut into groups of different padded shapes (`GroupedStep`): the same update as
`sao.train.steps`' one-call step over their union, its exact micro-batch accumulation carried across jitted calls.

The learner cuts a batch's rows, sorted by length, into groups each padded only to its own bucket
(`batching.length_groups`), so the FLOPs go to real tokens; `make_grouped_actor_step` / `make_grouped_critic_step`
build the actor's and the critic's.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from sao.models.config import ModelConfig
from sao.train import actor_losses
from sao.train import config as config_lib
from sao.train import mesh as mesh_lib
from sao.train import steps
from sao.train.mesh_jit import MeshJit


class GroupedStep:
  """One training step over several batches of different padded shapes — the same update as one step over their
  union (the step's exact micro-batch accumulation, carried across jitted calls):

      carry ← 0;  for each group g:  carry ← carry + (Σ_m ∇loss_sum_m, Σ_m loss_sum_m, metrics) of g
      state ← AdamW(state, carry.grads / N)        (N = `denominator(action_mask)` of the whole batch)

  Used for rows sorted by length, each group padded only to its own bucket (`Learner`, `batching.length_groups`):
  the FLOPs go to real tokens. Each group `[b_g, T_g]` is split into micro-batches as the one-call step splits its
  batch. Programs: one `accumulate` per group shape (traced under the step's `kind` in `TRACE_COUNTS`), one `apply`
  and one `zeros`, whatever the shapes.
  """

  def __init__(self, micro_loss: Callable, kind: str, denominator_fn: Callable[[jax.Array], jax.Array],
               tx: optax.GradientTransformation, trainable: Any, state_shardings: Any, mesh: Mesh,
               micro_batch_size: int | steps.MicroBatching):
    self.kind = kind
    self._micro_loss = micro_loss
    rep = self._replicated = mesh_lib.replicated(mesh)
    # One program per batch shape (called eagerly on the host mask, a token count is several ops compiled per T). Its
    # result stays on the device: `apply` takes it from there, so the host never waits for the groups' programs
    # before queueing `apply` and moving on (reading it back cost the toy update 7-9 ms of XLA idling;
    # docs/performance_learner.md, "The main job's update").
    self._denominator = MeshJit(lambda mask: denominator_fn(mask).astype(jnp.float32), None,
                                name=f"{kind}_denominator", out_shardings=rep)
    self._trainable = trainable
    self._micro_batch_size = micro_batch_size
    self._param_shardings = state_shardings.params
    # (grad_sum, loss_sum, metrics): grads sharded as their params (frozen leaves are None on both sides).
    self._carry_shardings = (steps.partition_params(state_shardings.params, trainable)[0], rep, rep)
    self._zeros = None  # built on first use: the metric shapes come from tracing the loss once
    self._lock = threading.Lock()  # `precompile` may run in a thread beside the first call
    self._applied_compiled = False

    def accumulate(params, batch, carry):
      steps.TRACE_COUNTS[kind] += 1
      return steps.accumulate_grads(micro_loss, trainable, micro_batch_size, mesh, params, batch, carry)

    self._accumulate = MeshJit(accumulate, mesh, name=f"{kind}_accumulate",
                               in_shardings=(self._param_shardings, mesh_lib.batch_sharding(mesh),
                                             self._carry_shardings),
                               out_shardings=self._carry_shardings, donate_argnums=(2,))
    self._apply = MeshJit(functools.partial(steps.apply_grads, tx, trainable), None, name=f"{kind}_apply",
                          in_shardings=(state_shardings, self._carry_shardings, rep, rep),
                          out_shardings=(state_shardings, rep), donate_argnums=(0,))

  def __call__(self, state: steps.TrainState, groups: list[dict], rng: jax.Array, action_mask: Any
               ) -> tuple[steps.TrainState, dict]:
    """`groups`: the batch's rows as device batches `[b_g, T_g]` (each holding the step's batch keys);
    `action_mask`: the whole batch's `[B, T]` host mask (the denominator and the `tokens` metric)."""
    del rng  # as in the one-call step
    if not groups:
      raise ValueError(f"{self.kind} step: no groups")
    self._build_zeros(state.params, groups[0])
    carry = self._zeros(state.params)
    for batch in groups:
      carry = self._accumulate(state.params, batch, carry)
    mask = np.asarray(action_mask).astype(bool)
    denominator = self._denominator(mask)  # a device scalar: no wait here (see __init__)
    return self._apply(state, carry, denominator, np.float32(mask.sum()))

  def precompile(self, state: steps.TrainState, group: Any) -> None:
    """Compiles the programs a call with a group shaped as `group` runs (`accumulate` for that shape; `zeros` and
    `apply`, shape-free, on the first call) without running them. `state`: the role's abstract state
    (`jax.ShapeDtypeStruct`s with its shardings: nothing is read, so a thread may compile while the live state is
    being donated); `group`: a device batch `[b_g, T_g]` of the step's batch keys, or its abstract shapes. A later
    call on those shapes finds the compiled programs in jit's cache: nothing is traced or compiled again."""
    self._build_zeros(state.params, group)
    carry = self._zeros.eval_shape(state.params)  # carries the carry's shardings, as the real call's zeros do
    self._accumulate.lower(state.params, group, carry).compile()
    if not self._applied_compiled:
      scalar = jax.ShapeDtypeStruct((), jnp.float32)
      denominator = jax.ShapeDtypeStruct((), jnp.float32, sharding=self._replicated)  # as `_denominator` returns it
      self._zeros.lower(state.params).compile()
      self._apply.lower(state, carry, denominator, scalar).compile()
      self._applied_compiled = True

  def precompile_denominator(self, mask_shape: tuple[int, int]) -> None:
    """Compiles the denominator's program for a whole batch's `[B, T]` action mask (host bool)."""
    self._denominator.lower(jax.ShapeDtypeStruct(mask_shape, np.bool_)).compile()

  def _build_zeros(self, params: Any, group: Any) -> None:
    """`self._zeros`, the zero carry's program, built on first use: the metric shapes come from tracing the loss
    once on one micro-batch of `group`."""
    with self._lock:
      if self._zeros is not None:
        return
      num_micro = steps.num_micro_batches(group["input_ids"].shape, self._micro_batch_size)
      example = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
                             jax.eval_shape(lambda b: steps.split_micro(b, num_micro), group))
      metrics_shape = steps.check_metric_names(self._micro_loss, self.kind, params, example)
      trainable = self._trainable
      zeros = lambda params: steps.zero_carry(metrics_shape, steps.partition_params(params, trainable)[0])
      self._zeros = MeshJit(zeros, None, name=f"{self.kind}_zeros", in_shardings=(self._param_shardings,),
                            out_shardings=self._carry_shardings)


def make_grouped_actor_step(kind: str, model_config: ModelConfig, tx: optax.GradientTransformation, trainable: Any,
                            state_shardings: Any, mesh: Mesh, *, micro_batch_size: int | steps.MicroBatching = 0, temperature: float = 1.0,
                            logprob_chunk_size: int = 128, hparams: dict[str, Any] | None = None) -> GroupedStep:
  """`steps.make_actor_step`'s update as a `GroupedStep` (same arguments)."""
  loss = actor_losses.get(kind)
  if hparams is None:
    hparams = loss.hparams(config_lib.default_learner_config())
  micro_loss = steps.actor_micro_loss(loss, dict(hparams), model_config, temperature, logprob_chunk_size)
  return GroupedStep(micro_loss, kind, loss.denominator, tx, trainable, state_shardings, mesh, micro_batch_size)


def make_grouped_critic_step(model_config: ModelConfig, tx: optax.GradientTransformation, trainable: Any,
                             state_shardings: Any, mesh: Mesh, *, micro_batch_size: int | steps.MicroBatching = 0,
                             value_clip: float = 0.0) -> GroupedStep:
  """`steps.make_critic_step`'s update as a `GroupedStep` (same arguments)."""
  return GroupedStep(steps.critic_micro_loss(model_config, value_clip), "value", actor_losses.token_count, tx,
                     trainable, state_shardings, mesh, micro_batch_size)
