"""The task dispenser's checkpoint format (`TaskDispenser.state_dict`): a JSON-serialisable dict of the records in
`sao.transport.leases`, with the identity of the dispenser it was taken from so that a restore into a dispenser with
other tasks or another mode fails loudly instead of leasing the wrong tasks.

Identity keys: format, seed, num_tasks, mode, group_size. Position: epoch, position, policy_version. Outstanding
work: retry and eval_queue (`Work` records), leases (`lease_record`), groups ({group id: {size, accepted}}), plus
the eval collector's own keys (`sao.transport.evaluation.EvalCollector.state_dict`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from sao.transport.leases import Group, Lease, Work

STATE_FORMAT = 1


def identity(seed: int, num_tasks: int, mode: str, group_size: int) -> dict[str, Any]:
  """The keys that tie a state to the dispenser it came from."""
  return {"format": STATE_FORMAT, "seed": seed, "num_tasks": num_tasks, "mode": mode, "group_size": group_size}


def check_identity(state: Mapping[str, Any], mine: Mapping[str, Any]) -> None:
  """Raises ValueError when `state` has another format, or was taken from a dispenser other than `mine`
  (`identity`)."""
  if state.get("format") != STATE_FORMAT:
    raise ValueError(f"dispenser state format {state.get('format')!r}, expected {STATE_FORMAT}")
  for key in ("seed", "num_tasks", "mode", "group_size"):
    if state[key] != mine[key]:
      raise ValueError(f"dispenser state {key}={state[key]!r} does not match this dispenser's {mine[key]!r}")


def work_record(work: Work) -> dict[str, Any]:
  return dataclasses.asdict(work)


def work_from_record(d: Mapping[str, Any]) -> Work:
  return Work(d["task_index"], d["is_validation"], d["group_id"], tuple(d["sample_indices"]), d["eval_version"])


def lease_record(lease: Lease, now: float) -> dict[str, Any]:
  """A live lease as restorable state: its work, its samples not yet accepted and the TTL it has left at `now`."""
  return {"lease_id": lease.lease_id, "worker_id": lease.worker_id, "work": work_record(lease.work),
          "pending": sorted(lease.pending), "ttl_left_s": max(0.0, lease.expires_at - now)}


def group_record(group: Group) -> dict[str, Any]:
  return {"size": group.size, "accepted": sorted(group.accepted)}


def group_from_record(d: Mapping[str, Any]) -> Group:
  return Group(d["size"], set(d["accepted"]))
