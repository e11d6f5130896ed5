"""Compiling a learner's programs before an update first needs them, in a thread beside the run.

An update's programs are compiled per batch shape, and the update that first meets a shape waits while XLA compiles it:
at full scale one bucket's update compiles for ≈ 15 minutes (docs/tpu_compile_report.md) while the pod idles, once per
bucket length the batches reach. `learner_programs` compiles every program an update can call ahead — per bucket length
`[B, T]` of the one-call update, or per group shape `[b, T_g]` with `batching.length_groups`
(`sao.train.batching.group_shapes`) — from abstract states (`jax.ShapeDtypeStruct`s with the learner's shardings: no
live array is read, so the live states may be donated meanwhile), into the same jit caches the update's calls hit: a
later call on those shapes traces and compiles nothing. `Precompiler` runs it in a daemon thread (on a host's idle cores
while the accelerators train) and stops it between two programs. Where the host has no idle core (the toy on 2 CPU
cores, docs/performance_learner.md) it only moves the compile work, and the toy configs turn it off.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Iterator, Sequence

import jax
import numpy as np
from absl import logging

from sao.train import batching, critic_correction, steps
from sao.train import grouped_targets, targets
from sao.transport.trajectory import Trajectory

ROLES = ("actor", "critic")


def learner_programs(learner: Any, batch_size: int, max_tokens: int,
                     roles: Sequence[str] | None = None) -> Iterator[str]:
  """Compiles, without running them, the programs an update of `learner` (a `sao.train.learner.Learner`) on
  `batch_size` trajectories of at most `max_tokens` tokens can call, one per iteration, yielding its name.

  With `batching.length_groups`: for every group shape `[b, T_g]` the grouped step of each of `roles` (default: the
  learner's roles), in that order (and the critic's values with the critic's step); then, for every batch length,
  the steps' denominators and the update's target programs (`sao.train.targets`). Without: for every bucket length
  `T`, the update's programs on the padded `[B, T]` batch in the update's order (critic values, critic targets,
  critic step, advantages, actor step; the steps of `roles` only). Bad roles raise before anything is compiled."""
  c = learner.config
  if roles is None:
    roles = ROLES if learner.critic is not None else ("actor",)
  unknown = set(roles) - set(ROLES)
  if unknown or not roles or ("critic" in roles and learner.critic is None):
    raise ValueError(f"precompile: roles {tuple(roles)}: expected a non-empty subset of {ROLES} (algorithm "
                     f"{c.algorithm!r} {'has a' if learner.critic is not None else 'has no'} critic)")
  if batch_size < 1 or max_tokens < 1:
    raise ValueError(f"precompile: batch_size ({batch_size}) and max_tokens ({max_tokens}) must be >= 1")
  return _programs(learner, batch_size, max_tokens, tuple(roles))


class AbstractBatches:
  """Abstract device batches of a learner: the batch fields' dtypes and ranks as `make_batch` builds them (plus what
  the update adds to a step's batch), sharded as the learner shards its batches."""

  def __init__(self, learner: Any):
    host, _ = learner.make_batch([Trajectory(task_id="0", token_ids=np.zeros(2, np.int32),
                                             action_mask=np.array([False, True]),
                                             rollout_logprobs=np.zeros(2, np.float32), reward=0.0)])
    self._dtypes = {k: np.asarray(v).dtype for k, v in host.items()}
    self._dtypes.update(returns=np.float32, old_values=np.float32, values=np.float32, advantages=np.float32,
                        seq_advantages=np.float32)
    self._per_row = {k for k, v in host.items() if np.ndim(v) == 1} | {"seq_advantages"}
    self._trailing = {k: np.shape(v)[2:] for k, v in host.items()}  # routed_experts' [L, k]
    self.fields = batching.fields(host)  # the fields an update's device batch holds
    self._sharding = learner._batch_sharding  # pylint: disable=protected-access

  def __call__(self, keys: Sequence[str], b: int, length: int) -> dict[str, jax.ShapeDtypeStruct]:
    return {k: jax.ShapeDtypeStruct((b,) if k in self._per_row else (b, length, *self._trailing.get(k, ())),
                                    self._dtypes[k],
                                    sharding=self._sharding) for k in keys}


def abstract_batch(learner: Any, batch_size: int, length: int) -> dict[str, jax.ShapeDtypeStruct]:
  """The abstract device batch an update of `learner` gets from `batch_size` trajectories padded to `length` tokens:
  every `batching.fields` at `[B]` or `[B, length, ...]`, `B` padded as the learner's batcher pads."""
  batches = AbstractBatches(learner)
  return batches(batches.fields, learner.batcher.padded_rows(batch_size), length)


def _programs(learner: Any, batch_size: int, max_tokens: int, roles: tuple[str, ...]) -> Iterator[str]:
  batcher = learner.batcher
  rows = batcher.padded_rows(batch_size)
  if learner.config.batching.length_groups:
    yield from _group_programs(learner, rows, max_tokens, roles, AbstractBatches(learner))
  else:
    yield from _batch_programs(learner, rows, batching.lengths_upto(max_tokens, batcher.bucket_lengths), roles,
                               AbstractBatches(learner))


def _compiled_output(lowered: Any, index: int | None = None) -> jax.ShapeDtypeStruct:
  """`_compiled_outputs`, or its output `index` of a tuple."""
  outputs = _compiled_outputs(lowered)
  return outputs if index is None else outputs[index]


def _batch_programs(learner: Any, rows: int, lengths: Sequence[int], roles: tuple[str, ...],
                    batch: AbstractBatches) -> Iterator[str]:
  """The one-call update's programs on `[rows, T]` for each `T` of `lengths` (`Learner._update_sao` /
  `_update_group` with `groups=None`)."""
  # pylint: disable=protected-access  (the learner's own programs, as `sao.aot.driver` records them)
  c = learner.config
  rng = jax.ShapeDtypeStruct(np.shape(learner.rng), learner.rng.dtype)  # shape and dtype only: no data is read
  loss = learner.actor_loss
  for length in lengths:
    whole = batch(batch.fields, rows, length)
    if learner.critic is None:
      extra = {"seq_advantages": _compiled_output(targets.group_advantages.lower(whole, c.group.normalize_std), 0)}
    else:
      s = c.sao
      critic = learner.critic.abstract_state()
      values = _compiled_output(learner._critic_values.lower(critic.params, whole))  # the whole batch, as called
      returns = _target_programs(learner, whole, values)
      if "critic" in roles:
        critic_batch = dict(_ids(whole), action_mask=whole["action_mask"], returns=returns, old_values=values)
        learner._critic_step.lower(critic, critic_batch, rng).compile()
      extra = {"advantages": _compiled_output(targets.policy_advantages.lower(
          whole, values, returns, s.gamma, s.lambda_policy_alpha, s.whiten_advantages, s.lambda_policy), 0)}
    if "actor" in roles:
      actor_batch = steps.select({**whole, **extra}, loss.batch_keys, f"actor loss {loss.name!r}")
      learner._actor_steps[loss.name].lower(learner.actor.abstract_state(), actor_batch, rng).compile()
    yield f"update [{rows}, {length}] ({', '.join(roles)})"


def _target_programs(learner: Any, whole: dict[str, Any], values: Any) -> Any:
  """Compiles the critic's targets for a whole batch (`critic_targets`; with no use for the pre-update values also
  `monte_carlo_returns`, what an untraced update calls; with V-trace targets the actor's forward and
  `critic_correction.vtrace_targets` instead); returns the abstract R."""
  config = learner.config
  s = config.sao
  if s.critic_target_correction == "vtrace":
    logprobs = _compiled_output(learner.actor_logprobs.lower(learner.actor.abstract_state().params, _ids(whole)), 0)
    return _compiled_output(critic_correction.vtrace_targets.lower(
        whole, values, logprobs, s.gamma, s.lambda_critic, s.vtrace_rho_bar, s.vtrace_c_bar), 0)
  if not targets.critic_reads_values_before(config):
    targets.monte_carlo_returns.lower(whole, s.gamma).compile()
  return _compiled_output(targets.critic_targets.lower(whole, values, s.gamma, s.lambda_critic), 0)


def _ids(batch: dict[str, Any]) -> dict[str, Any]:
  return {k: batch[k] for k in ("input_ids", "attention_mask")}


def _group_programs(learner: Any, rows: int, max_tokens: int, roles: tuple[str, ...],
                    batch: AbstractBatches) -> Iterator[str]:
  """The grouped update's programs (`batching.length_groups`, `sao.train.grouped_update`): per group shape the
  steps of `roles` and the per-group targets; then the merges of the groups' statistics; per batch length the steps'
  denominators."""
  # pylint: disable=protected-access
  c = learner.config
  batcher = learner.batcher
  shapes = batching.group_shapes(rows, c.batching.length_groups, batcher.batch_multiple, batcher.bucket_lengths,
                                 max_tokens)
  for role in roles:
    if role == "actor":
      state = learner.actor.abstract_state()
      for b, length in shapes:
        learner._grouped_actor_step.precompile(state, batch(learner.actor_loss.batch_keys, b, length))
        yield f"actor step [{b}, {length}]"
    else:
      state = learner.critic.abstract_state()
      for b, length in shapes:
        learner._critic_values.lower(state.params, _ids(batch(batch.fields, b, length))).compile()
        learner._grouped_critic_step.precompile(state, batch(steps.CRITIC_KEYS, b, length))
        yield f"critic values and step [{b}, {length}]"
  if learner.critic is None:
    yield from _sequence_advantage_programs(learner, rows, sorted({b for b, _ in shapes}), batch)
  else:
    stats = {}
    for b, length in shapes:
      stats = _group_target_programs(learner, batch(batch.fields, b, length))
      yield f"targets [{b}, {length}]"
    groups = batching.group_count(rows, c.batching.length_groups, batcher.batch_multiple)
    _merge_programs(learner, stats, groups)
    yield f"merges of {groups} groups"
  for length in sorted({length for _, length in shapes}):
    for role in roles:
      grouped = learner._grouped_actor_step if role == "actor" else learner._grouped_critic_step
      grouped.precompile_denominator((rows, length))
    yield f"denominators [{rows}, {length}]"


def _sequence_advantage_programs(learner: Any, rows: int, group_rows: Sequence[int],
                                 batch: AbstractBatches) -> Iterator[str]:
  """GSPO / GRPO grouped: `Â_i` over the batch's per-row fields, and each group's rows of it (`grouped_update`)."""
  # pylint: disable=protected-access
  per_row = batch(("rewards", "group_ids", "valid"), rows, 1)
  seq_advantages = _compiled_outputs(targets.group_advantages.lower(per_row, learner.config.group.normalize_std))[0]
  for b in group_rows:
    learner._take_rows.lower(seq_advantages, np.zeros(b, np.int64)).compile()
  yield f"sequence advantages [{rows}] and their groups' rows"


def _group_target_programs(learner: Any, part: dict[str, Any]) -> dict[str, Any]:
  """Compiles one group's SAO target programs (`sao.train.grouped_update`) for the abstract group batch `part`;
  returns the abstract statistics they give, what the merges take."""
  # pylint: disable=protected-access
  s = learner.config.sao
  critic = learner.critic.abstract_state()
  values = _compiled_outputs(learner._critic_values.lower(critic.params, _ids(part)))
  # The targets that read V⁰ run when the config needs them and whenever `update_traced` asks for V⁰ (its traces).
  if s.critic_target_correction == "vtrace":  # `sao.train.critic_correction`: the actor's forward, then V-trace
    logprobs = _compiled_outputs(learner.actor_logprobs.lower(learner.actor.abstract_state().params, _ids(part)))[0]
    returns, (traced, counts) = _compiled_outputs(critic_correction.grouped_vtrace_targets.lower(
        part, values, logprobs, s.gamma, s.lambda_critic, s.vtrace_rho_bar, s.vtrace_c_bar))
    traced = dict(traced, vtrace_counts=counts)
  else:
    returns, traced = _compiled_outputs(grouped_targets.critic_targets.lower(part, values, s.gamma, s.lambda_critic))
  stats = traced
  if not targets.critic_reads_values_before(learner.config):
    returns, stats = _compiled_outputs(grouped_targets.monte_carlo_returns.lower(part, s.gamma))
  advantages, advantage_stats = _compiled_outputs(grouped_targets.policy_advantages.lower(
      part, values, returns, s.gamma, s.lambda_policy_alpha, s.lambda_policy))
  final = advantage_stats["advantages"]
  if s.whiten_advantages:
    final = _compiled_outputs(grouped_targets.whiten.lower(advantages, part["action_mask"], final))[1]
  return {"returns": stats, "traced": traced, "advantages": advantage_stats, "final": final}


def _merge_programs(learner: Any, stats: dict[str, Any], groups: int) -> None:
  """Compiles the merges of `groups` groups' statistics (`stats`: one group's, abstract; every group's have the
  same replicated scalars)."""
  fused = not targets.critic_reads_values_before(learner.config)
  counts = stats["traced"].pop("vtrace_counts", None)
  if counts is not None:  # V-trace targets: the groups' clip counts merge on their own
    critic_correction.merge_clip_counts.lower([counts] * groups).compile()
  if fused:
    returns = _compiled_outputs(grouped_targets.merge_returns.lower([stats["returns"]] * groups))[0]
  else:
    returns = _compiled_outputs(grouped_targets.merge_critic_targets.lower([stats["returns"]] * groups))[0]
  grouped_targets.merge_critic_targets.lower([stats["traced"]] * groups).compile()
  merged = _compiled_outputs(grouped_targets.merge_advantages.lower([stats["advantages"]] * groups, returns))[0]
  if learner.config.sao.whiten_advantages:
    grouped_targets.merge_final.lower([stats["final"]] * groups).compile()
  else:
    grouped_targets.merge_final.lower([merged]).compile()


def _compiled_outputs(lowered: Any) -> Any:
  """Compiles `lowered` and returns its whole output pytree as abstract arguments of the next programs (shapes,
  dtypes and the shardings the compiled program gives them: jit's cache keys on an argument's sharding)."""
  shardings = lowered.compile().output_shardings
  return jax.tree.map(lambda info, sharding: jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=sharding),
                      lowered.out_info, shardings)


class Precompiler:
  """Programs compiled in a daemon thread (`learner_programs`), started at construction. `stop()` asks it to stop
  after the program it is compiling and waits for that (a run that ends does not wait for the rest). An error is logged with its
  traceback and ends the thread: the update then compiles each remaining program when it first needs it, as
  without precompiling."""

  def __init__(self, programs: Iterator[str], label: str = ""):
    """`programs`: an iterator that compiles one program per step (`learner_programs`, or several chained)."""
    self.compiled: list[str] = []
    self.error: BaseException | None = None
    self.label = label
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, args=(programs,), name="sao-precompile", daemon=True)
    self._thread.start()

  def _run(self, programs: Iterator[str]) -> None:
    start = time.perf_counter()
    try:
      for name in programs:
        self.compiled.append(name)
        if self._stop.is_set():
          return
    except Exception as e:  # pylint: disable=broad-except  (logged; the update compiles what is left on demand)
      self.error = e
      logging.exception("precompile %s: failed after %d programs; the update compiles the rest when it meets them",
                        self.label, len(self.compiled))
      return
    logging.info("precompile %s: %d programs in %.1f s", self.label, len(self.compiled), time.perf_counter() - start)

  def stop(self, timeout_s: float | None = None) -> None:
    self._stop.set()
    self._thread.join(timeout_s)

  def wait(self, timeout_s: float | None = None) -> None:
    """Waits until every program is compiled (or the thread ended otherwise)."""
    self._thread.join(timeout_s)

  @property
  def done(self) -> bool:
    return not self._thread.is_alive()
