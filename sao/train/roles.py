"""One role of the learner (actor / critic): its abstract params, shardings, optimizer and train state, and the NaN
guard's per-role count of consecutive skipped updates (`count_nonfinite`).

The jitted steps skip a non-finite update themselves (`steps`: metric `skipped` = 1, state unchanged); here the skips
are counted in step order, per role, and the run stops with `NonFiniteError` after `nan_guard_limit` in a row.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import ml_collections
from absl import logging
from clu import parameter_overview
from jax.sharding import Mesh

from sao.train import optim, state as state_lib, steps
from sao.train import mesh as mesh_lib


class NonFiniteError(RuntimeError):
  """Raised after `nan_guard_limit` consecutive non-finite updates of one role."""


class Role:
  """Everything one role (actor / critic) needs: abstract params, shardings, optimizer, state."""

  def __init__(self, name: str, boxed: Any, role_config: ml_collections.ConfigDict, mesh: Mesh):
    self.name = name
    self.abstract_params = nn.meta.unbox(boxed)
    self.param_shardings = mesh_lib.param_shardings(boxed, mesh)
    self.tx, self.labels, self.counts = optim.make_optimizer(role_config.optimizer, self.abstract_params,
                                                             tuple(role_config.frozen_params), name)
    self.trainable = optim.trainable_mask(self.labels)
    self.shardings = state_lib.state_shardings(self.abstract_params, self.param_shardings, self.tx, mesh)
    self.state: steps.TrainState | None = None
    self.consecutive_nonfinite = 0
    parameter_overview.log_parameter_overview(self.sharded_abstract_params(), include_stats="sharding",
                                              msg=f"{name} parameters (shape, mesh sharding):",
                                              jax_logging_process=0)

  def abstract_state(self) -> steps.TrainState:
    return state_lib.abstract_state(self.abstract_params, self.shardings, self.tx)

  def sharded_abstract_params(self) -> Any:
    """The params as `jax.ShapeDtypeStruct`s carrying their shardings."""
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), self.abstract_params,
                        self.param_shardings)


def count_nonfinite(roles: Sequence[Role], metrics: Mapping[str, float], limit: int, update_index: int) -> int:
  """Counts one update's NaN-guard skips per role, in step order (`roles` in the order their steps ran; each role's
  `<name>/skipped_epoch<k>` metrics, then the actor's `actor/skipped`): a skip adds one to the role's
  `consecutive_nonfinite`, a finite step resets it. Raises `NonFiniteError` when a count reaches `limit`.

  Returns the number of actor updates applied (0 or 1): the policy version's increment."""
  applied = 0
  for role in roles:
    keys = sorted(k for k in metrics if k.startswith(f"{role.name}/skipped_epoch"))
    keys += [f"{role.name}/skipped"] if role.name == "actor" and "actor/skipped" in metrics else []
    for key in keys:
      if metrics[key]:
        role.consecutive_nonfinite += 1
        logging.warning("NaN guard: non-finite %s loss or gradient at learner update %d (%s); update skipped "
                        "(%d in a row)", role.name, update_index, key, role.consecutive_nonfinite)
        if role.consecutive_nonfinite >= limit:
          raise NonFiniteError(f"NaN guard: {role.name} had {role.consecutive_nonfinite} consecutive non-finite "
                               f"updates (nan_guard_limit={limit}), last at learner update {update_index}")
      else:
        role.consecutive_nonfinite = 0
        if role.name == "actor" and key == "actor/skipped":
          applied += 1
  return applied
