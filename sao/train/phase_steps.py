"""One phase's training steps (`sao.train.trainer.Trainer._train`): value pretraining's or RL's, on every process.

Each step, in order:

    every process agrees on (phase, step, learner clock) and on a stop any of them was asked for (SIGTERM)
    the step's batch: process 0 takes the first `rollout.batch_size` finished trajectories from the service
        (`Trainer._take`), keeps the trainable ones no more than `server.max_staleness` versions behind the policy
        about to be updated, quarantines the ones the batcher cannot take, and `share`s the rest with its learner
        clock; the other processes receive them and check their own clock (`coordination.Diverged` on a mismatch)
    the update (`Learner.update`; every `critic_trace_every` SAO steps traced: `sao.analysis.critic_traces`)
    process 0's adaptive staleness bound follows the update's log-prob mismatch (`sao.transport.staleness_control`)
    a new policy version is exported and published (`Trainer._publish`), waited for when a checkpoint is due or at
        the phase's last step
    process 0 writes the validation results, the step's progress row and line (`sao.train.progress`)
    a checkpoint when one is due (only after an update: `num_updates` is the checkpoint step)

A stop request ends the phase before its next step with a checkpoint of the learner as it is, where the phase keeps
checkpoints, and then `StopRequested` (every process stops at the same step).
"""
from __future__ import annotations

import time
from typing import Any

from sao.analysis import critic_traces
from sao.models.config import ModelConfig
from sao.train import batching
from sao.train import checkpoint as ckpt_lib
from sao.train import coordination
from sao.train import progress
from sao.train import stop_signal
from sao.train.learner import Learner
from sao.transport import flow
from sao.transport.trajectory import Trajectory

# pylint: disable=protected-access  (the trainer's own hooks: `_take`, `_publish`, `_checkpoint_extra`, `_print`)


class PhaseSteps:
  """The steps of `phase` that `trainer` (a `sao.train.trainer.Trainer`) runs on `learner`. `server`: process 0's
  trajectory service (None on the other processes); `checkpointer`: None where the phase keeps no checkpoints."""

  def __init__(self, trainer: Any, learner: Learner, model_config: ModelConfig, server: Any,
               checkpointer: ckpt_lib.Checkpointer | None, phase: str):
    self.trainer = trainer
    self.learner = learner
    self.model_config = model_config
    self.server = server
    self.checkpointer = checkpointer
    self.phase = phase
    self.validation = float("nan")  # the latest validation success rate (the progress row's `validation`)
    self.last_time = 0.0  # when the previous row was written (throughput's clock)
    self.wait_s = 0.0  # process 0: how long the step waited for its batch (busy fraction's input)

  def run(self, start_step: int, end_step: int) -> dict[str, float]:
    """Steps `start_step` … `end_step − 1`; returns the last progress row (process 0; {} elsewhere)."""
    trainer, learner, server, checkpointer = self.trainer, self.learner, self.server, self.checkpointer
    phase = self.phase
    self.validation = trainer.validations[-1][1] if trainer.validations else float("nan")
    self.last_time = time.time()
    for step in range(start_step, end_step):
      # Every process at the same step of the same phase, and a stop any of them was asked for (SIGTERM) is all's.
      flags = trainer.channel.agree("step", {"phase": phase, "step": step, "num_updates": learner.num_updates,
                                             "version": learner.version}, {"stop": trainer.stop.requested})
      batch = None if flags.get("stop") else self._next_batch(step)
      if batch is None:
        self._stop_point(step)
      trajectories, trainable, stale, unusable = batch
      if server is not None:
        server.quarantine(unusable, step)
      version_before = learner.version
      with trainer.channel.busy(f"{phase} step {step}: update"):
        metrics = self._update(trainable, step) if trainable else {}
      if server is not None:
        server.mark_consumed(trajectories, step)
      if trainer.staleness is not None and metrics:  # the bound follows this update's mismatch (process 0's server)
        metrics = {**metrics, **trainer.staleness.step(metrics, server.stats())}
        server.set_max_outstanding(trainer.staleness.allowance)
      # A checkpoint saves the dispenser state of the version just published: that publish finishes first (as does
      # the phase's last, so that its row reports it).
      checkpoint_due = checkpointer is not None and bool(trainable) and checkpointer.is_due(learner.num_updates)
      if learner.version != version_before:
        reports = trainer._publish(self.model_config, learner, wait=checkpoint_due or step == end_step - 1)
        for report in reports[:-1]:  # two finished here (the previous version's, then this one's): a row each
          trainer.writer.write_scalars(step, report)
        metrics = {**metrics, **(reports[-1] if reports else {})}
      if trainer.is_coordinator:  # metrics, validation results and progress lines are process 0's
        self._log_step(step, end_step, trajectories, trainable, stale, unusable, metrics)
      if checkpoint_due:
        # Only after an update: a batch with nothing trainable leaves `num_updates` (the checkpoint step) as is.
        with trainer.channel.busy(f"{phase} step {step}: checkpoint"):
          learner.save_checkpoint(checkpointer, extra=trainer._checkpoint_extra(step + 1, phase, server))
      trainer.writer.flush()
    return trainer.history[-1] if trainer.history else {}

  def _next_batch(self, step: int) -> tuple[list[Trajectory], list[Trajectory], int, list] | None:
    """(the step's trajectories, the trainable ones, the stale count, the unusable ones), or None when the run stops
    (SIGTERM while process 0 waited for rollouts). Process 0 takes them from the service and shares the trainable
    ones with its learner clock; the other processes receive those (and check their clock against process 0's: a
    mismatch is a `Diverged` error, not a silently different update)."""
    trainer, learner = self.trainer, self.learner
    clock = {"step": step, "num_updates": learner.num_updates, "version": learner.version}
    if not trainer.is_coordinator:
      message = trainer.channel.share("batch")
      if message.data.get("stop"):
        return None
      if {k: message.data[k] for k in clock} != clock:
        raise coordination.Diverged(f"process {trainer.channel.process_id} is at {clock} but process 0 sent the "
                                    f"batch of {message.data}")
      return message.trajectories, message.trajectories, 0, []
    c = trainer.config
    waited_from = time.time()
    trajectories = trainer._take(self.server, c.rollout.batch_size)
    if trajectories is None:
      trainer.channel.share("batch", {**clock, "stop": True})
      return None
    self.wait_s = time.time() - waited_from  # the trainer idle, waiting for rollouts (busy fraction's input)
    # Timeouts / env errors are not trained on; nor is anything more than `max_staleness` versions behind the
    # policy about to be updated (accepted when fresh, it aged in the buffer). Both are counted.
    fresh = [flow.is_fresh(learner.version, t.policy_version, c.server.max_staleness) for t in trajectories]
    trainable = [t for t, ok in zip(trajectories, fresh) if t.is_trainable and ok]
    stale = sum(1 for t, ok in zip(trajectories, fresh) if t.is_trainable and not ok)
    # Records the batcher cannot take are quarantined (persisted, never re-read), not a crash on every restart.
    trainable, unusable = batching.split_unbatchable(trainable, learner.batcher)
    trainer.channel.share("batch", clock, trainable)
    return trajectories, trainable, stale, unusable

  def _update(self, trainable: list[Trajectory], step: int) -> dict[str, float]:
    """`learner.update`; every `critic_trace_every` SAO steps it also dumps one success and one failure trajectory
    with the critic's pre-update per-token values (`sao.analysis.critic_traces`)."""
    trainer, learner = self.trainer, self.learner
    every = trainer.config.critic_trace_every
    if trainer.config.learner.algorithm != "sao" or not every or step % every:
      return learner.update(trainable)
    batch, stats = learner.make_batch(trainable)
    rows = [trainable[i] for i in stats.source_indices]
    picks = critic_traces.pick_rows([t.reward for t in rows], seed=trainer.config.seed * 1_000_003 + step)
    metrics, per_token = learner.update_traced(batch, list(picks.values()))
    traces = []
    for i, (kind, row) in enumerate(picks.items()):
      traj, length = rows[row], rows[row].num_tokens
      traces.append(critic_traces.CriticTrace(
          step=step, phase=self.phase, kind=kind, reward=traj.reward, policy_version=traj.policy_version,
          task_id=traj.task_id, num_turns=traj.num_turns, turn_boundaries=traj.turn_boundaries,
          action_mask=traj.action_mask, **{k: v[i, :length] for k, v in per_token.items()}))
    if trainer.trace_writer is not None:
      trainer.trace_writer.write(traces)
    return metrics

  def _stop_point(self, step: int) -> None:
    """Stops the run before `step` (SIGTERM): a checkpoint of the learner as it is, where the phase keeps them and
    the latest one is older, then `StopRequested` (every process gets here at the same step)."""
    trainer, learner, checkpointer, phase = self.trainer, self.learner, self.checkpointer, self.phase
    saved = ""
    if checkpointer is not None and learner.num_updates and learner.num_updates not in checkpointer.all_steps():
      checkpointer.wait()
      with trainer.channel.busy(f"{phase} step {step}: checkpoint before stopping"):
        learner.save_checkpoint(checkpointer, extra=trainer._checkpoint_extra(step, phase, self.server))
      checkpointer.wait()
      saved = f"; checkpoint at learner update {learner.num_updates} (re-running the command resumes there)"
    elif checkpointer is not None and learner.num_updates:
      saved = f"; the latest checkpoint (learner update {learner.num_updates}) holds it"
    trainer._print(f"[trainer] stopped by SIGTERM before {phase} step {step}{saved}")
    raise stop_signal.StopRequested(f"stopped by SIGTERM before {phase} step {step}{saved}")

  def _log_step(self, step: int, end_step: int, trajectories, trainable, stale: int, unusable,
                metrics: dict[str, float]) -> None:
    trainer = self.trainer
    for result in self.server.eval_results():
      self.validation = result.success_rate
      trainer.validations.append((result.policy_version, result.success_rate))
      trainer.writer.write_scalars(step, {"validation": result.success_rate,
                                          "validation/policy_version": result.policy_version,
                                          "validation/num_tasks": result.num_tasks,
                                          **{f"validation/harness/{h}": v for h, v in result.by_harness.items() if h}})
    now = time.time()
    row = progress.progress_row(trajectories, len(trainable), stale, len(unusable), metrics, self.validation,
                                now - self.last_time, self.wait_s, self.learner.version)
    self.last_time = now
    trainer.writer.write_scalars(step, progress.step_scalars(metrics, row, trajectories, self.phase))
    trainer.history.append({"step": step, **row})
    if step % trainer.config.log_every == 0 or step == end_step - 1:
      print(progress.progress_line(self.phase, step, row), flush=True)
