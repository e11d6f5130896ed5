"""The tasks a `sao.transport.dispenser.TaskDispenser` hands out: each split encoded once as (task id, task JSON)
pairs, checked when the dispenser is built (every task has its id field, ids are unique, tasks are JSON), and the
training split's per-epoch order, a function of (seed, epoch) only so a checkpoint needs no RNG state."""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import numpy as np


def task_id(task: Mapping[str, Any], id_key: str, where: str) -> str:
  """`task[id_key]` as a string; `where` names the task in the error when it has no such field."""
  if id_key not in task:
    raise ValueError(f"{where}: task has no {id_key!r} field: keys {sorted(task)}")
  return str(task[id_key])


def encode_tasks(tasks: Sequence[Mapping[str, Any]], id_key: str, where: str) -> list[tuple[str, str]]:
  """(task id, task JSON with sorted keys) per task; fails on duplicate ids or non-JSON tasks now, not at lease
  time. `where` names the split in errors ("tasks", "validation_tasks")."""
  out, seen = [], set()
  for i, task in enumerate(tasks):
    tid = task_id(task, id_key, f"{where}[{i}]")
    if tid in seen:
      raise ValueError(f"{where}[{i}]: duplicate task id {tid!r}")
    seen.add(tid)
    try:
      out.append((tid, json.dumps(task, sort_keys=True)))
    except TypeError as e:
      raise ValueError(f"{where}[{i}] (id {tid!r}) is not JSON-serialisable: {e}") from e
  return out


def epoch_order(seed: int, epoch: int, num_tasks: int) -> np.ndarray:
  """The training tasks' order in `epoch`: a permutation of range(num_tasks) seeded by (seed, epoch)."""
  return np.random.default_rng([seed, epoch]).permutation(num_tasks)
