"""Trajectories → one padded, bucketed `[B, T]` host batch for the learner.

Padding is on the right. `T` is the smallest bucket length ≥ the longest trajectory (beyond the largest bucket: the
next multiple of it), so the jitted steps see few shapes. `B` is padded up to `pad_batch_to` (if set) and to a
multiple of `batch_multiple` (batch shards × micro-batch size) with all-zero rows: attention and action masks 0,
reward 0, a group id of their own — they add nothing to any loss sum, denominator or statistic.

Batch fields (numpy):
  input_ids [B, T] int32, attention_mask [B, T] int32, action_mask [B, T] bool, rollout_logprobs [B, T] float32,
  rewards [B] float32, token_rewards [B, T] float32 (the reward on the last action token), group_ids [B] int32
  (first-appearance index of each trajectory's `group_id`; padding rows −1, −2, …), policy_version [B] int32,
  valid [B] bool (a real trajectory).
With MoE routing replay (`Batcher(routing=...)`, `learner.routing_replay`) also routed_experts [B, T, L, k] int32:
each trajectory's engine record (`Trajectory.routed_experts` [R, L·k] reshaped) in its first R rows, −1 elsewhere
(nothing replayed: padding, tokens after the last model turn, a trajectory without a record).
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Sequence

import numpy as np
from absl import logging

from sao.models import routed_experts as routing
from sao.transport.trajectory import Trajectory

FIELDS = ("input_ids", "attention_mask", "action_mask", "rollout_logprobs", "rewards", "token_rewards", "group_ids",
          "policy_version", "valid")
ROUTED_EXPERTS = "routed_experts"  # the optional field of routing replay


def fields(batch: dict) -> tuple[str, ...]:
  """`FIELDS`, and `routed_experts` when the batch has it: the fields an update copies to the device."""
  return FIELDS + ((ROUTED_EXPERTS,) if ROUTED_EXPERTS in batch else ())


@dataclasses.dataclass
class BatchStats:
  """What happened to the trajectories handed in."""
  num_trajectories: int  # kept (trained on)
  num_dropped_status: int  # timeout / env_error
  num_dropped_no_action: int  # no action token: nothing to train on
  num_padding_rows: int
  max_length: int  # longest kept trajectory, tokens
  padded_shape: tuple[int, int]
  source_indices: tuple[int, ...] = ()  # row i of the batch is trajectories[source_indices[i]]


def bucket_length(length: int, buckets: Sequence[int]) -> int:
  """Smallest bucket ≥ length; beyond the largest bucket, the next multiple of it."""
  for b in buckets:
    if length <= b:
      return int(b)
  top = int(buckets[-1])
  return -(-length // top) * top


class Batcher:
  """Builds padded batches and logs the first time each padded shape appears (each new shape compiles the steps).

  Args:
    bucket_lengths: increasing candidate `T`s (`config.batching.bucket_lengths`).
    batch_multiple: `B` is padded to a multiple of this (batch shards × micro-batch size).
    pad_batch_to: minimum `B` after padding (0 = off).
    routing: (layers, top_k, num_experts) of the policy's MoE for routing replay (adds `routed_experts`), or None.
  """

  def __init__(self, bucket_lengths: Sequence[int], batch_multiple: int = 1, pad_batch_to: int = 0,
               routing: tuple[int, int, int] | None = None):
    if not bucket_lengths or list(bucket_lengths) != sorted(set(bucket_lengths)):
      raise ValueError(f"batching.bucket_lengths: must be strictly increasing, got {tuple(bucket_lengths)}")
    if batch_multiple < 1:
      raise ValueError(f"batch_multiple: must be >= 1, got {batch_multiple}")
    self.bucket_lengths = tuple(int(b) for b in bucket_lengths)
    self.batch_multiple = int(batch_multiple)
    self.pad_batch_to = int(pad_batch_to)
    self.routing = routing
    self.seen_shapes: set[tuple[int, int]] = set()

  def padded_rows(self, num_trajectories: int) -> int:
    """`B` of a batch of `num_trajectories` kept trajectories: at least `pad_batch_to`, rounded up to a multiple of
    `batch_multiple`."""
    rows = max(int(num_trajectories), self.pad_batch_to)
    return -(-rows // self.batch_multiple) * self.batch_multiple

  def __call__(self, trajectories: Sequence[Trajectory]) -> tuple[dict[str, np.ndarray], BatchStats]:
    """Returns `(batch, stats)`; raises ValueError when no trajectory is trainable."""
    kept, source, dropped_status, dropped_empty = [], [], 0, 0
    for index, traj in enumerate(trajectories):
      if not traj.is_trainable:
        dropped_status += 1
      elif traj.num_action_tokens == 0:
        dropped_empty += 1
      else:
        kept.append(traj)
        source.append(index)
    if dropped_status or dropped_empty:
      logging.info("batching: dropped %d trajectories (timeout/env_error) and %d without action tokens",
                   dropped_status, dropped_empty)
    if not kept:
      raise ValueError(f"trajectories: none of {len(trajectories)} is trainable "
                       f"({dropped_status} timeout/env_error, {dropped_empty} without action tokens)")
    max_length = max(t.num_tokens for t in kept)
    num_tokens = bucket_length(max_length, self.bucket_lengths)
    rows = self.padded_rows(len(kept))
    batch = {
        "input_ids": np.zeros((rows, num_tokens), np.int32),
        "attention_mask": np.zeros((rows, num_tokens), np.int32),
        "action_mask": np.zeros((rows, num_tokens), bool),
        "rollout_logprobs": np.zeros((rows, num_tokens), np.float32),
        "rewards": np.zeros((rows,), np.float32),
        "token_rewards": np.zeros((rows, num_tokens), np.float32),
        "group_ids": -np.arange(1, rows + 1, dtype=np.int32),
        "policy_version": np.zeros((rows,), np.int32),
        "valid": np.zeros((rows,), bool),
    }
    if self.routing is not None:
      batch[ROUTED_EXPERTS] = np.full((rows, num_tokens, *self.routing[:2]), routing.MISSING, np.int32)
    group_index: dict[str, int] = {}
    for i, traj in enumerate(kept):
      n = traj.num_tokens
      batch["input_ids"][i, :n] = traj.token_ids
      batch["attention_mask"][i, :n] = 1
      batch["action_mask"][i, :n] = traj.action_mask
      batch["rollout_logprobs"][i, :n] = np.where(traj.action_mask, traj.rollout_logprobs, 0.0)
      batch["rewards"][i] = traj.reward
      batch["group_ids"][i] = group_index.setdefault(traj.group_id, len(group_index))
      batch["policy_version"][i] = traj.policy_version
      batch["valid"][i] = True
      # The outcome reward on the last action token (`sao.core.advantages.place_terminal_reward`, here in numpy: on
      # the host, the jnp version dispatched ~10 eager ops per batch and compiled them for every new T).
      batch["token_rewards"][i, traj.reward_token_index()] = traj.reward
      if self.routing is not None and traj.routed_experts is not None:
        batch[ROUTED_EXPERTS][i, :len(traj.routed_experts)] = self._routed(traj)
    shape = (rows, num_tokens)
    if shape not in self.seen_shapes:
      self.seen_shapes.add(shape)
      logging.info("batching: new padded shape [B, T] = %s (the learner's steps compile for it)", shape)
    stats = BatchStats(len(kept), dropped_status, dropped_empty, rows - len(kept), max_length, shape, tuple(source))
    return batch, stats

  def _routed(self, traj: Trajectory) -> np.ndarray:
    """The trajectory's record as [R, L, k]; ValueError naming it when it does not fit this policy's MoE."""
    layers, top_k, num_experts = self.routing
    record = traj.routed_experts
    if record.shape[1] != layers * top_k:
      raise ValueError(f"routed_experts of task {traj.task_id!r}: rows of {record.shape[1]} ids, the policy routes "
                       f"{layers} layers × top-{top_k} = {layers * top_k}")
    record = record.reshape(len(record), layers, top_k)
    routing.check(record, traj.num_tokens, layers, top_k, num_experts, f"routed_experts of task {traj.task_id!r}")
    return record


@dataclasses.dataclass(frozen=True)
class LengthGroup:
  """Rows of a padded batch trained together at a shorter padded length: `batch[k][rows, :length]`."""
  rows: np.ndarray  # [b] int64 row indices into the batch, by increasing length
  length: int  # T_g: the bucket of the group's longest row (never above the batch's T)


def length_groups(attention_mask: np.ndarray, num_groups: int, rows_multiple: int,
                  buckets: Sequence[int]) -> list[LengthGroup]:
  """Rows sorted by length (stable) and cut into `num_groups` groups of `b` rows (`b` = ⌈B / num_groups⌉ rounded up
  to a multiple of `rows_multiple`; the last group takes the rest), each padded to the bucket of its longest row.

  Right padding and causal attention make a row's outputs independent of how far it is padded, so training the
  groups is the same update as training the batch; only the padded FLOPs go. The group shapes `[b, T_g]` come from
  `buckets`, so the steps compile for at most `len(buckets)` lengths (× 2 row counts when B is not a multiple of
  b). `attention_mask`: `[B, T]`, B a multiple of `rows_multiple`.
  """
  mask = np.asarray(attention_mask)
  rows, num_tokens = mask.shape
  if num_groups < 1 or rows_multiple < 1:
    raise ValueError(f"length_groups: num_groups ({num_groups}) and rows_multiple ({rows_multiple}) must be >= 1")
  if rows % rows_multiple:
    raise ValueError(f"length_groups: {rows} rows is not a multiple of rows_multiple = {rows_multiple}")
  lengths = mask.astype(bool).sum(axis=1)
  order = np.argsort(lengths, kind="stable")
  size = -(-rows // (num_groups * rows_multiple)) * rows_multiple
  groups = []
  for start in range(0, rows, size):
    members = order[start:start + size]
    groups.append(LengthGroup(members, min(bucket_length(int(lengths[members].max()), buckets), num_tokens)))
  return groups


def group_count(rows: int, num_groups: int, rows_multiple: int) -> int:
  """How many groups `length_groups` cuts a batch of `rows` rows into (`num_groups` or fewer)."""
  size = -(-rows // (num_groups * rows_multiple)) * rows_multiple
  return -(-rows // size)


def group_shapes(rows: int, num_groups: int, rows_multiple: int, buckets: Sequence[int],
                 max_tokens: int) -> list[tuple[int, int]]:
  """Every group shape `[b, T_g]` that `length_groups` can cut from a batch of `rows` rows whose trajectories hold at
  most `max_tokens` tokens: the row counts it uses for `rows` (one, or two when the last group takes the rest) × the
  buckets up to `max_tokens`'s bucket. What the learner compiles ahead (`Learner.precompile`)."""
  if rows < 1 or max_tokens < 1:
    raise ValueError(f"group_shapes: rows ({rows}) and max_tokens ({max_tokens}) must be >= 1")
  if num_groups < 1 or rows_multiple < 1:
    raise ValueError(f"group_shapes: num_groups ({num_groups}) and rows_multiple ({rows_multiple}) must be >= 1")
  size = -(-rows // (num_groups * rows_multiple)) * rows_multiple
  counts = sorted({min(size, rows - start) for start in range(0, rows, size)}, reverse=True)
  return [(b, length) for b in counts for length in lengths_upto(max_tokens, buckets)]


def lengths_upto(max_tokens: int, buckets: Sequence[int]) -> list[int]:
  """The padded lengths a batch of trajectories of at most `max_tokens` tokens can take: the buckets up to
  `max_tokens`'s bucket."""
  top = bucket_length(max_tokens, buckets)
  return sorted({min(int(b), top) for b in buckets} | {top})


def digest(batch: dict[str, np.ndarray]) -> str:
  """A short hash of a host batch's `FIELDS` present in it (names, dtypes, shapes and bytes): two processes that
  hold the same batch get the same digest."""
  h = hashlib.blake2b(digest_size=12)
  for key in fields(batch):
    if key in batch:
      value = np.ascontiguousarray(batch[key])
      h.update(f"{key}:{value.dtype}:{value.shape};".encode())
      h.update(value.tobytes())
  return h.hexdigest()


def check_batch(batch: dict[str, np.ndarray]) -> None:
  """Raises ValueError naming the field when a batch has a missing field or inconsistent shapes/dtypes."""
  for name in FIELDS:
    if name not in batch:
      raise ValueError(f"batch: missing field {name!r}")
  rows, num_tokens = np.shape(batch["input_ids"])
  for name in FIELDS:
    shape = np.shape(batch[name])
    expected = (rows, num_tokens) if name in ("input_ids", "attention_mask", "action_mask", "rollout_logprobs",
                                             "token_rewards") else (rows,)
    if shape != expected:
      raise ValueError(f"batch: field {name!r} has shape {shape}, expected {expected}")
  if ROUTED_EXPERTS in batch and np.shape(batch[ROUTED_EXPERTS])[:2] != (rows, num_tokens):
    raise ValueError(f"batch: field {ROUTED_EXPERTS!r} has shape {np.shape(batch[ROUTED_EXPERTS])}, expected "
                     f"({rows}, {num_tokens}, layers, top_k)")
  for name in ("rollout_logprobs", "rewards", "token_rewards"):
    if not np.all(np.isfinite(batch[name])):
      raise ValueError(f"batch: field {name!r} has non-finite values")


def split_unbatchable(trajectories: Sequence[Trajectory], batcher: Batcher
                      ) -> tuple[list[Trajectory], list[tuple[Trajectory, str]]]:
  """(usable, [(unusable, why)]): the trainable `trajectories` that `batcher` + `check_batch` can take, and those
  they cannot, each with the error it raised alone.

  Submission-time validation should keep every such record out; this is the learner's last line, so that a record
  that still gets through (or was logged by an older trainer) is quarantined instead of failing every step that
  reads it. The whole batch is tried first (the common case costs one extra host batch build); only on failure
  is each record tried alone, with a throwaway batcher so that no probe's shape is logged as the learner's. If
  every record passes alone the failure is not theirs, and the original error is raised.
  """
  if not trajectories:
    return [], []
  try:
    check_batch(batcher(trajectories)[0])
    return list(trajectories), []
  except Exception as whole:  # pylint: disable=broad-except  (attributed per record below, or re-raised)
    probe = Batcher(batcher.bucket_lengths, routing=batcher.routing)
    usable, unusable = [], []
    for traj in trajectories:
      try:
        check_batch(probe([traj])[0])
        usable.append(traj)
      except Exception as e:  # pylint: disable=broad-except
        unusable.append((traj, f"{type(e).__name__}: {e}"))
    if not unusable:
      raise whole
    logging.error("batching: %d of %d trajectories cannot be batched (first: %s); quarantining them",
                  len(unusable), len(trajectories), unusable[0][1])
    return usable, unusable
