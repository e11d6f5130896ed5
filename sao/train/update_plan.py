"""An update's plan: what decides the programs a learner update runs, their shapes and their count.

In a multi-process job every process computes the plan of its next update and the processes compare them before
any program runs (`sao.train.coordination.KeyValueChannel.agree`): equal plans mean the same programs in the same
order, so a process about to run something else stops the job with both plans named instead of waiting forever in a
collective the others never join.
"""
from __future__ import annotations

from typing import Any, Sequence

import ml_collections
import numpy as np

from sao.train import batching, targets


def update_plan(config: ml_collections.ConfigDict, num_updates: int, version: int, batch: dict,
                groups: Sequence[batching.LengthGroup] | None, rows: np.ndarray,
                previous_programs: dict | None, actor_start: dict[str, Any] | None = None) -> dict[str, Any]:
  """The plan (JSON-serialisable) of an update of a learner with `config` at clock (`num_updates`, `version`) on
  the host `batch`: the batch's shape and content digest (`batching.digest`), the length groups' shapes `[b_g, T_g]`
  (None: one `[B, T]` call), the traced rows, the algorithm's branches (SAO: the critic epochs, whether the actor
  steps, whether V⁰ is computed, whitening, the critic targets' correction) and `previous_programs`, the previous
  update's recorded program sequence (`sao.train.mesh_jit.ProgramLog.summary`). `actor_start`: the learner's
  `sao.train.actor_start.ActorStart.plan` (whether the actor steps, and the explained-variance window that decided
  it); None: the step count `critic_warmup_steps` decides."""
  plan: dict[str, Any] = {
      "update": int(num_updates), "version": int(version), "algorithm": config.algorithm,
      "batch": [int(d) for d in np.shape(batch["input_ids"])], "batch_digest": batching.digest(batch),
      "groups": None if groups is None else [[len(g.rows), int(g.length)] for g in groups],
      "traced_rows": [int(r) for r in rows], "previous_update_programs": previous_programs}
  if config.algorithm == "sao":
    plan.update(critic_epochs=int(config.sao.critic_epochs),
                actor_step=bool(num_updates >= config.sao.critic_warmup_steps),
                values_before=bool(rows.size) or targets.critic_reads_values_before(config),
                whiten=bool(config.sao.whiten_advantages),
                critic_target_correction=str(config.sao.critic_target_correction))
    plan.update(actor_start or {})
  return plan
