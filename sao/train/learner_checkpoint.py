"""A learner's checkpoint: the pytrees and the JSON metadata a step holds, and their restore into the learner.

    items(learner)      `actor` (and `critic`) `TrainState`, `rng` (`{"key": key}`): orbax `Composite` items
    metadata(learner)   num_updates (the warmup clock), version, the NaN guard's counters, the learner config, the
                        actor start's state (`sao.train.actor_start`), the caller's `extra` and the param layout

`sao.train.checkpoint.Checkpointer` writes and reads them without knowing the learner; `Learner.save_checkpoint` /
`Learner.restore_checkpoint` call `save` / `restore` here. A restore goes straight into the learner's shardings
(`abstract_items`), refuses a step of another param layout, and only warns when the learner config differs.
"""
from __future__ import annotations

import json
from typing import Any

import jax
import numpy as np
from absl import logging

from sao.train import checkpoint as ckpt_lib
from sao.train import distributed
from sao.train import mesh as mesh_lib
from sao.train.config import config_to_json


def items(learner: Any) -> dict[str, Any]:
  """The pytrees a checkpoint holds: `actor` (and `critic`) `TrainState`, `rng` (`{"key": key}`). `learner` is a
  `sao.train.learner.Learner`."""
  # The key lives on one local device of each process; saved as one replicated global array (the same on all).
  key = distributed.global_array(np.asarray(jax.device_get(learner.rng)), mesh_lib.replicated(learner.mesh))
  out = {"actor": learner.actor.state, "rng": {"key": key}}
  if learner.critic is not None:
    out["critic"] = learner.critic.state
  return out


def abstract_items(learner: Any) -> dict[str, Any]:
  """`items` as `jax.ShapeDtypeStruct`s in the learner's shardings (the restore target)."""
  out = {"actor": learner.actor.abstract_state(),
         "rng": {"key": jax.ShapeDtypeStruct(learner.rng.shape, learner.rng.dtype,
                                             sharding=mesh_lib.replicated(learner.mesh))}}
  if learner.critic is not None:
    out["critic"] = learner.critic.abstract_state()
  return out


def metadata(learner: Any, extra: dict | None = None) -> dict[str, Any]:
  """JSON metadata: num_updates (the warmup clock), version, NaN-guard counters, the config, and the caller's
  `extra` (e.g. the task dispenser's state)."""
  return {
      "num_updates": learner.num_updates,
      "version": learner.version,
      "consecutive_nonfinite": {"actor": learner.actor.consecutive_nonfinite,
                                "critic": learner.critic.consecutive_nonfinite if learner.critic else 0},
      "config": config_to_json(learner.config),
      "actor_start": learner.actor_start.state_dict(),
      "extra": extra or {},
      ckpt_lib.LAYOUT_KEY: ckpt_lib.PARAM_LAYOUT,  # restores refuse a tree of another layout
  }


def save(learner: Any, checkpointer: ckpt_lib.Checkpointer, extra: dict | None = None,
         only_if_due: bool = False) -> bool:
  """Saves the learner as step `num_updates` (with `only_if_due`: when `checkpointer.is_due` it)."""
  if only_if_due and not checkpointer.is_due(learner.num_updates):
    return False
  return checkpointer.save(learner.num_updates, items(learner), metadata(learner, extra))


def restore(learner: Any, checkpointer: ckpt_lib.Checkpointer, step: int | None = None) -> dict | None:
  """Restores the newest readable step (or `step`) into the learner; returns its `extra`, or None if there is no
  checkpoint."""
  restored = checkpointer.restore(abstract_items(learner), step, expect={ckpt_lib.LAYOUT_KEY: ckpt_lib.PARAM_LAYOUT})
  if restored is None:
    return None
  meta = restored.metadata
  if json.loads(meta["config"]) != json.loads(config_to_json(learner.config)):
    logging.warning("checkpoint: step %d was written with a different learner config", restored.step)
  learner.actor.state = restored.items["actor"]
  learner.actor.consecutive_nonfinite = int(meta["consecutive_nonfinite"]["actor"])
  if learner.critic is not None:
    learner.critic.state = restored.items["critic"]
    learner.critic.consecutive_nonfinite = int(meta["consecutive_nonfinite"]["critic"])
  learner.rng = jax.device_put(np.asarray(restored.items["rng"]["key"]))
  learner.num_updates = int(meta["num_updates"])
  learner.version = int(meta["version"])
  learner.actor_start.load_state_dict(meta.get("actor_start"))
  logging.info("checkpoint: restored step %d from %s (version %d)", restored.step, checkpointer.directory,
               learner.version)
  return meta["extra"]
