"""Orbax checkpoints of the learner, and single-tree param files (the critic's value checkpoint).

One checkpoint step holds (orbax `Composite` items):
  actor   the actor `TrainState` (params, optimizer state, step, skipped)
  critic  the critic `TrainState` (SAO only)
  rng     the learner's PRNG key
  meta    JSON: num_updates (the warmup clock), version, NaN-guard counters, the learner config, and `extra` (an
          opaque JSON dict from the caller, e.g. the task dispenser's state)
Restores go straight into the learner's shardings (abstract `ShapeDtypeStruct` targets) and continue bit-for-bit.
A step that fails to restore (cut off mid-save, truncated files) is skipped with a warning naming the error, and the
next older one is tried.
"""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from sao.train.config import config_to_json

if TYPE_CHECKING:
  from sao.train.learner import Learner


def save_params(path: str, params: Any) -> None:
  """Saves one param tree to `path` (a new directory), synchronously."""
  path = os.path.abspath(path)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(path, params)


def load_params(path: str, abstract: Any) -> Any:
  """Loads a tree saved by `save_params` into `abstract`'s shapes and shardings (`ShapeDtypeStruct` leaves)."""
  path = os.path.abspath(path)
  if not os.path.isdir(path):
    raise ValueError(f"critic.init_path: no checkpoint directory at {path!r}")
  with ocp.StandardCheckpointer() as checkpointer:
    return checkpointer.restore(path, abstract)


class Checkpointer:
  """Periodic async checkpoints of a `Learner` under `directory/<step>` (step = `learner.num_updates`).

  Args:
    directory: root directory (created).
    every: `maybe_save` saves when `num_updates % every == 0`.
    max_to_keep: older steps are deleted.
    async_save: write in a background thread (the device→host copy still happens before `save` returns, so the
      next step may donate the state).
  """

  def __init__(self, directory: str, every: int = 50, max_to_keep: int = 3, async_save: bool = True):
    if every < 1:
      raise ValueError(f"checkpoint.every: must be >= 1, got {every}")
    self.directory = os.path.abspath(directory)
    self.every = every
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, enable_async_checkpointing=async_save,
                                           create=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  @classmethod
  def from_config(cls, directory: str, config) -> "Checkpointer":
    c = config.checkpoint
    return cls(directory, c.every, c.max_to_keep, c.async_save)

  def all_steps(self) -> list[int]:
    self.manager.reload()
    return sorted(self.manager.all_steps())

  def maybe_save(self, learner: "Learner", extra: dict | None = None) -> bool:
    if learner.num_updates % self.every:
      return False
    return self.save(learner, extra)

  def save(self, learner: "Learner", extra: dict | None = None) -> bool:
    """Saves the learner now at step `learner.num_updates`; `extra` must be JSON-serialisable."""
    meta = {
        "num_updates": learner.num_updates,
        "version": learner.version,
        "consecutive_nonfinite": {"actor": learner.actor.consecutive_nonfinite,
                                  "critic": learner.critic.consecutive_nonfinite if learner.critic else 0},
        "config": config_to_json(learner.config),
        "extra": extra or {},
    }
    try:
      json.dumps(meta["extra"])
    except TypeError as e:
      raise ValueError(f"extra: not JSON-serialisable: {e}") from e
    items = {"actor": ocp.args.StandardSave(learner.actor.state),
             "rng": ocp.args.StandardSave({"key": learner.rng}),
             "meta": ocp.args.JsonSave(meta)}
    if learner.critic is not None:
      items["critic"] = ocp.args.StandardSave(learner.critic.state)
    # Finish the previous async save first: orbax allows one in flight, and its failure must surface here.
    self.manager.wait_until_finished()
    return self.manager.save(learner.num_updates, args=ocp.args.Composite(**items), force=True)

  def restore(self, learner: "Learner", step: int | None = None) -> dict | None:
    """Restores the newest readable step (or `step`) into `learner`; returns its `extra` dict, or None if the
    directory holds no checkpoint. Unreadable steps are skipped with a warning; if none is readable, raises."""
    self.manager.wait_until_finished()
    candidates = [step] if step is not None else self.all_steps()[::-1]
    errors = []
    for candidate in candidates:
      try:
        return self._restore_step(learner, candidate)
      except Exception as e:  # noqa: BLE001 — any unreadable step is reported and the next one tried
        logging.warning("checkpoint: step %d in %s is unreadable (%s: %s); trying an older one", candidate,
                        self.directory, type(e).__name__, e)
        errors.append(f"step {candidate}: {type(e).__name__}: {e}")
    if errors:
      raise RuntimeError(f"checkpoint: no readable checkpoint in {self.directory}: " + "; ".join(errors))
    return None

  def _restore_step(self, learner: "Learner", step: int) -> dict:
    items = {"actor": ocp.args.StandardRestore(learner.actor.abstract_state()),
             "rng": ocp.args.StandardRestore({"key": jax.ShapeDtypeStruct(learner.rng.shape, learner.rng.dtype)}),
             "meta": ocp.args.JsonRestore()}
    if learner.critic is not None:
      items["critic"] = ocp.args.StandardRestore(learner.critic.abstract_state())
    restored = self.manager.restore(step, args=ocp.args.Composite(**items))
    meta = restored["meta"]
    saved_config = json.loads(meta["config"])
    current = json.loads(config_to_json(learner.config))
    if saved_config != current:
      logging.warning("checkpoint: step %d was written with a different learner config", step)
    learner.actor.state = restored["actor"]
    if learner.critic is not None:
      learner.critic.state = restored["critic"]
      learner.critic.consecutive_nonfinite = int(meta["consecutive_nonfinite"]["critic"])
    learner.actor.consecutive_nonfinite = int(meta["consecutive_nonfinite"]["actor"])
    learner.rng = jax.device_put(np.asarray(restored["rng"]["key"]))
    learner.num_updates = int(meta["num_updates"])
    learner.version = int(meta["version"])
    logging.info("checkpoint: restored step %d from %s (version %d)", step, self.directory, learner.version)
    return meta["extra"]

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()
