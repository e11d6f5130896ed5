"""The records of leasing: the dispenser's config, a unit of work to lease, a lease, an open group.

Plain dataclasses; `sao.transport.dispenser.TaskDispenser` owns and mutates them under its lock (the dispenser's
docstring says how leases expire, are held during a submission, and are re-leased).
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class DispenserConfig:
  """Knobs of the task dispenser.

  Attributes:
    mode: "sao" (one sample per task) or "group" (G samples per task in one lease).
    group_size: G in group mode; must be 1 in SAO mode.
    seed: seeds the per-epoch shuffle.
    lease_ttl_s: a lease lapses this long after issue or its last heartbeat.
    num_epochs: passes over the training tasks; None for no limit.
    id_key: the task dict's id field.
    env_name: registry name sent with every lease (sao.rollout.envs.make).
    train_temperature, eval_temperature: sampling temperatures for training and validation leases.
    eval_every: evaluate the validation split at policy versions divisible by this; 0 disables.
    success_threshold: an eval episode succeeded when its reward >= this.
  """
  mode: str = "sao"
  group_size: int = 1
  seed: int = 0
  lease_ttl_s: float = 600.0
  num_epochs: int | None = None
  id_key: str = "id"
  env_name: str = ""
  train_temperature: float = 1.0
  eval_temperature: float = 0.0
  eval_every: int = 0
  success_threshold: float = 1.0

  def __post_init__(self):
    if self.mode not in ("sao", "group"):
      raise ValueError(f"DispenserConfig.mode must be 'sao' or 'group', got {self.mode!r}")
    if self.group_size < 1 or (self.mode == "sao" and self.group_size != 1):
      raise ValueError(f"DispenserConfig.group_size must be >= 1 (and 1 in sao mode), got {self.group_size} "
                       f"in mode {self.mode!r}")
    if self.lease_ttl_s <= 0:
      raise ValueError(f"DispenserConfig.lease_ttl_s must be > 0, got {self.lease_ttl_s}")
    if self.num_epochs is not None and self.num_epochs < 1:
      raise ValueError(f"DispenserConfig.num_epochs must be >= 1 or None, got {self.num_epochs}")
    if self.eval_every < 0:
      raise ValueError(f"DispenserConfig.eval_every must be >= 0, got {self.eval_every}")


@dataclasses.dataclass
class Work:
  """Samples of one task still to be leased. `eval_version` is -1 for training work."""
  task_index: int
  is_validation: bool
  group_id: str
  sample_indices: tuple[int, ...]
  eval_version: int = -1


@dataclasses.dataclass
class Lease:
  """One outstanding lease: a worker runs `sample_indices` of `task` and submits one trajectory per index."""
  lease_id: str
  worker_id: str
  task_id: str
  task_json: str
  group_id: str
  sample_indices: tuple[int, ...]
  is_validation: bool
  temperature: float
  env_name: str
  eval_version: int
  expires_at: float
  work: Work
  pending: set[int] = dataclasses.field(default_factory=set)  # indices not yet accepted
  submitting: set[int] = dataclasses.field(default_factory=set)  # indices between begin_submission and its end

  @property
  def num_samples(self) -> int:
    return len(self.sample_indices)


@dataclasses.dataclass
class Group:
  """A task's G samples in one epoch (or one eval episode): open until all `size` sample indices are accepted,
  whichever leases they came through."""
  size: int
  accepted: set[int] = dataclasses.field(default_factory=set)
