"""Compiling a learner's programs before an update first needs them, in a thread beside the run.

With `batching.length_groups` an update runs per-group programs whose shapes `[b, T_g]` come from the bucket lengths
(`sao.train.batching.group_shapes`): the update that first meets a shape stalls while XLA compiles it (the toy's
first actor steps: ≈ 25 s of the run, docs/performance.md). `learner_programs` compiles every one of them ahead,
from abstract states (`jax.ShapeDtypeStruct`s with the learner's shardings: no live array is read, so the live
states may be donated meanwhile), into the same jit caches the update's calls hit: a later call on those shapes
traces and compiles nothing. `Precompiler` runs it in a daemon thread and stops it between two programs.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Iterator, Sequence

import jax
import numpy as np
from absl import logging

from sao.train import batching, steps
from sao.train import targets
from sao.transport.trajectory import Trajectory

ROLES = ("actor", "critic")


def learner_programs(learner: Any, batch_size: int, max_tokens: int,
                     roles: Sequence[str] | None = None) -> Iterator[str]:
  """Compiles, without running them, the programs an update of `learner` (a `sao.train.learner.Learner` with
  `batching.length_groups`; otherwise nothing) on `batch_size` trajectories of at most `max_tokens` tokens can call,
  one per iteration, yielding its name: for every group shape the step of each of `roles` (default: the learner's
  roles), in that order (and the
  critic's values with the critic's step); then, for every batch length, the steps' denominators and the update's
  target programs (`sao.train.targets`). Bad roles raise before anything is compiled."""
  c = learner.config
  if roles is None:
    roles = ROLES if learner.critic is not None else ("actor",)
  unknown = set(roles) - set(ROLES)
  if unknown or not roles or ("critic" in roles and learner.critic is None):
    raise ValueError(f"precompile: roles {tuple(roles)}: expected a non-empty subset of {ROLES} (algorithm "
                     f"{c.algorithm!r} {'has a' if learner.critic is not None else 'has no'} critic)")
  if not c.batching.length_groups:
    return iter(())
  return _programs(learner, batch_size, max_tokens, tuple(roles))


def _programs(learner: Any, batch_size: int, max_tokens: int, roles: tuple[str, ...]) -> Iterator[str]:
  # pylint: disable=protected-access  (the learner's own programs, as `sao.train.aot` records them)
  c = learner.config
  batcher = learner.batcher
  rows = -(-max(batch_size, batcher.pad_batch_to) // batcher.batch_multiple) * batcher.batch_multiple
  shapes = batching.group_shapes(rows, c.batching.length_groups, batcher.batch_multiple, batcher.bucket_lengths,
                                 max_tokens)
  # The batch fields' dtypes and ranks as `make_batch` builds them, plus what the update adds to a step's batch.
  host, _ = learner.make_batch([Trajectory(task_id="0", token_ids=np.zeros(2, np.int32),
                                           action_mask=np.array([False, True]),
                                           rollout_logprobs=np.zeros(2, np.float32), reward=0.0)])
  dtypes = {k: np.asarray(v).dtype for k, v in host.items()}
  dtypes.update(returns=np.float32, old_values=np.float32, values=np.float32, advantages=np.float32,
                seq_advantages=np.float32)
  per_row = {k for k, v in host.items() if np.ndim(v) == 1} | {"seq_advantages"}

  def batch(keys: Sequence[str], b: int, length: int) -> dict[str, jax.ShapeDtypeStruct]:
    return {k: jax.ShapeDtypeStruct((b,) if k in per_row else (b, length), dtypes[k],
                                    sharding=learner._batch_sharding) for k in keys}

  for role in roles:
    if role == "actor":
      state = learner.actor.abstract_state()
      for b, length in shapes:
        learner._grouped_actor_step.precompile(state, batch(learner.actor_loss.batch_keys, b, length))
        yield f"actor step [{b}, {length}]"
    else:
      state = learner.critic.abstract_state()
      for b, length in shapes:
        learner._critic_values.lower(state.params, batch(("input_ids", "attention_mask"), b, length)).compile()
        learner._grouped_critic_step.precompile(state, batch(steps.CRITIC_KEYS, b, length))
        yield f"critic values and step [{b}, {length}]"
  for length in sorted({length for _, length in shapes}):
    for role in roles:
      grouped = learner._grouped_actor_step if role == "actor" else learner._grouped_critic_step
      grouped.precompile_denominator((rows, length))
    whole = batch(batching.FIELDS, rows, length)
    if learner.critic is None:
      targets.group_advantages.lower(whole, c.group.normalize_std).compile()
    else:
      s = c.sao
      values = batch(("values",), rows, length)["values"]
      returns = targets.critic_targets.lower(whole, values, s.gamma, s.lambda_critic).compile()
      returns = jax.ShapeDtypeStruct(values.shape, values.dtype, sharding=returns.output_shardings[0])
      targets.policy_advantages.lower(whole, values, returns, s.gamma, s.lambda_policy_alpha, s.whiten_advantages,
                                      s.lambda_policy).compile()
    yield f"targets [{rows}, {length}]"


class Precompiler:
  """`learner_programs` in a daemon thread, started at construction. `stop()` asks it to stop after the program it
  is compiling and waits for that (a run that ends does not wait for the rest). An error is logged with its
  traceback and ends the thread: the update then compiles each remaining program when it first needs it, as
  without precompiling."""

  def __init__(self, learner: Any, batch_size: int, max_tokens: int, roles: Sequence[str] | None = None):
    self.compiled: list[str] = []
    self.error: BaseException | None = None
    self._stop = threading.Event()
    programs = learner_programs(learner, batch_size, max_tokens, roles)  # a generator: nothing runs yet
    self._thread = threading.Thread(target=self._run, args=(programs, tuple(roles or ())), name="sao-precompile",
                                    daemon=True)
    self._thread.start()

  def _run(self, programs: Iterator[str], roles: tuple[str, ...]) -> None:
    start = time.perf_counter()
    try:
      for name in programs:
        self.compiled.append(name)
        if self._stop.is_set():
          return
    except Exception as e:  # pylint: disable=broad-except  (logged; the update compiles what is left on demand)
      self.error = e
      logging.exception("precompile %s: failed after %d programs; the update compiles the rest when it meets them",
                        roles, len(self.compiled))
      return
    logging.info("precompile %s: %d programs in %.1f s", roles, len(self.compiled), time.perf_counter() - start)

  def stop(self, timeout_s: float | None = None) -> None:
    self._stop.set()
    self._thread.join(timeout_s)

  @property
  def done(self) -> bool:
    return not self._thread.is_alive()
