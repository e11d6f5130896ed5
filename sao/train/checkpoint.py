"""Orbax checkpoints of plain pytrees with JSON metadata, and single-tree param files (the critic's value checkpoint).

`Checkpointer` knows nothing of the learner (as the flax examples use orbax's `CheckpointManager`): a step holds named
pytrees (orbax `Composite` items, e.g. the learner's `actor` / `critic` `TrainState`s and its `rng`) and one JSON
`meta` dict. The learner builds both (`sao.train.learner_checkpoint.items` and `.metadata`) and applies what comes
back. Restores go straight into the caller's shardings (abstract `ShapeDtypeStruct` targets) and continue bit-for-bit.
A step that fails to restore (cut off mid-save, truncated files) is skipped with a warning naming the error, and the
next older one is tried. A step whose metadata lacks what the caller expects (`restore(expect=...)`, e.g. the param
layout) is refused with a ValueError naming the entry, before its arrays are read.

Param files (`save_params`) record the param layout (`sao.models.layers.PARAM_LAYOUT`) in `PARAMS_META`;
`load_params` refuses a tree saved in another layout (a square kernel would otherwise load silently transposed).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import jax
from jax.experimental import multihost_utils
import orbax.checkpoint as ocp
from absl import logging

from sao.models.layers import PARAM_LAYOUT

META = "meta"
PARAMS_META = "sao_params.json"  # written into a `save_params` directory, next to orbax's files
LAYOUT_KEY = "param_layout"


def layout_mismatch(found: Any, what: str) -> str | None:
  """The error message for a tree saved with param layout `found` (None: not recorded), or None if it is ours."""
  if found == PARAM_LAYOUT:
    return None
  saved = (f"{LAYOUT_KEY}={found!r}" if found is not None else
           f"no {LAYOUT_KEY} (written before linear kernels moved to HF's [out, in] layout: kernels [in, out])")
  return (f"{what}: saved with {saved}, but this code stores linear kernels as {PARAM_LAYOUT!r} ([out..., in...]); "
          f"re-export it through an HF directory (sao.models.hf) or train afresh")


def save_params(path: str, params: Any) -> None:
  """Saves one param tree to `path` (a new directory), synchronously, with its param layout (`PARAMS_META`)."""
  path = os.path.abspath(path)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(path, params)
  if jax.process_index() == 0:
    with open(os.path.join(path, PARAMS_META), "w", encoding="utf-8") as f:
      json.dump({LAYOUT_KEY: PARAM_LAYOUT}, f)
  if jax.process_count() > 1:
    # Every process returns only once the layout file exists: a process that loads the tree right away (the value
    # pretraining's hand-over) must not find the directory without it.
    multihost_utils.sync_global_devices(f"save_params:{path}")


def load_params(path: str, abstract: Any) -> Any:
  """Loads a tree saved by `save_params` into `abstract`'s shapes and shardings (`ShapeDtypeStruct` leaves).
  Raises ValueError if the directory is missing or holds another param layout."""
  path = os.path.abspath(path)
  if not os.path.isdir(path):
    raise ValueError(f"critic.init_path: no checkpoint directory at {path!r}")
  meta_path = os.path.join(path, PARAMS_META)
  found = None
  if os.path.exists(meta_path):
    with open(meta_path, encoding="utf-8") as f:
      found = json.load(f).get(LAYOUT_KEY)
  error = layout_mismatch(found, f"critic.init_path {path!r}")
  if error:
    raise ValueError(error)
  with ocp.StandardCheckpointer() as checkpointer:
    return checkpointer.restore(path, abstract)


@dataclasses.dataclass
class Restored:
  """One restored step: its number, the named pytrees (in the abstract targets' shardings), and the JSON metadata."""
  step: int
  items: dict[str, Any]
  metadata: dict[str, Any]


class Checkpointer:
  """Periodic async checkpoints under `directory/<step>`.

  Args:
    directory: root directory (created).
    every: `is_due(step)` when `step % every == 0` (the run's `checkpoint_every`).
    max_to_keep: older steps are deleted.
    async_save: write in a background thread (the device→host copy still happens before `save` returns, so the
      next step may donate the state).
  """

  def __init__(self, directory: str, every: int = 50, max_to_keep: int = 3, async_save: bool = True):
    if every < 1:
      raise ValueError(f"checkpoint_every: must be >= 1, got {every}")
    self.directory = os.path.abspath(directory)
    self.every = every
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, enable_async_checkpointing=async_save,
                                           create=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def all_steps(self) -> list[int]:
    self.manager.reload()
    return sorted(self.manager.all_steps())

  def is_due(self, step: int) -> bool:
    return step % self.every == 0

  def save(self, step: int, items: Mapping[str, Any], metadata: Mapping[str, Any]) -> bool:
    """Saves the pytrees `items` and the JSON-serialisable `metadata` as `step`, now (asynchronously)."""
    if META in items:
      raise ValueError(f"items: the name {META!r} is reserved for the metadata")
    try:
      json.dumps(metadata)
    except TypeError as e:
      raise ValueError(f"metadata: not JSON-serialisable: {e}") from e
    args = {name: ocp.args.StandardSave(tree) for name, tree in items.items()}
    args[META] = ocp.args.JsonSave(dict(metadata))
    # Finish the previous async save first: orbax allows one in flight, and its failure must surface here.
    self.manager.wait_until_finished()
    return self.manager.save(step, args=ocp.args.Composite(**args), force=True)

  def restore(self, abstract_items: Mapping[str, Any], step: int | None = None,
              expect: Mapping[str, Any] | None = None) -> Restored | None:
    """Restores the newest readable step (or `step`) into the shapes and shardings of `abstract_items` (trees of
    `jax.ShapeDtypeStruct`); None if the directory holds no checkpoint. Unreadable steps are skipped with a warning;
    if none is readable, raises RuntimeError. `expect`: metadata entries the step must hold (e.g. `{LAYOUT_KEY:
    PARAM_LAYOUT}`); a readable step without them raises ValueError naming the entry, before its arrays are read."""
    self.manager.wait_until_finished()
    candidates = [step] if step is not None else self.all_steps()[::-1]
    errors = []
    for candidate in candidates:
      if expect:
        self._check_expected(candidate, expect)
      try:
        args = {name: ocp.args.StandardRestore(tree) for name, tree in abstract_items.items()}
        args[META] = ocp.args.JsonRestore()
        restored = self.manager.restore(candidate, args=ocp.args.Composite(**args))
        return Restored(candidate, {name: restored[name] for name in abstract_items}, dict(restored[META]))
      except Exception as e:  # noqa: BLE001 — any unreadable step is reported and the next one tried
        logging.warning("checkpoint: step %d in %s is unreadable (%s: %s); trying an older one", candidate,
                        self.directory, type(e).__name__, e)
        errors.append(f"step {candidate}: {type(e).__name__}: {e}")
    if errors:
      raise RuntimeError(f"checkpoint: no readable checkpoint in {self.directory}: " + "; ".join(errors))
    return None

  def _check_expected(self, step: int, expect: Mapping[str, Any]) -> None:
    try:
      meta = dict(self.manager.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))[META])
    except Exception:  # noqa: BLE001 — an unreadable step is reported by the full restore that follows
      return
    for key, want in expect.items():
      found = meta.get(key)
      if found != want:
        message = (layout_mismatch(found, f"checkpoint step {step} in {self.directory}") if key == LAYOUT_KEY else
                   f"checkpoint step {step} in {self.directory}: metadata {key}={found!r}, expected {want!r}")
        raise ValueError(message)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()
