"""The task dispenser: which task each rollout worker runs next, with leases that survive dead workers.

Pure Python and thread-safe (one re-entrant lock). The trainer-side server (`sao.transport.server`) calls it; it
knows nothing about gRPC or trajectories' contents beyond the lease bookkeeping (the live leases and the samples they
hold: `sao.transport.lease_table`).

Modes:
  sao:   each task is leased once per epoch, with one sample (`sample_indices == (0,)`).
  group: (GSPO/GRPO) each task is leased once per epoch as a group of G samples in one lease
         (`sample_indices == (0, ..., G-1)`); the group is complete only when all G samples were accepted.

Leases expire `lease_ttl_s` after issue or the last heartbeat. Expired work (the samples not yet accepted) is
re-leased before any fresh task, under a *new* lease id with the same `group_id` and only the missing sample
indices, so a dead worker loses nothing. A late submission under an expired lease is rejected as UNKNOWN_LEASE
(`begin_submission`), whether or not its work was re-leased yet: one rule, no race about who wins.

A lease belongs to the worker that took it: a submission or heartbeat naming another worker is refused
(WRONG_WORKER / reported expired). Worker ids are self-declared, so this catches misrouted work, not an
attacker: every holder of the service token is trusted alike (docs/security.md).

Submissions are atomic with respect to expiry: `begin_submission` checks the lease *and* marks the sample as being
submitted in one locked step; a lease with a sample in submission does not expire (nor is re-leased) until the
server either `complete`s it (the record is durable) or `abort_submission`s it (it was not stored). Without this
hold a lease lapsing while its record was being written was re-leased and the sample accepted twice.

Evaluation: every `eval_every` policy versions (`set_policy_version`) the whole validation split is queued as
single-sample, `is_validation` leases at `eval_temperature`; their results feed the eval collector
(`sao.transport.evaluation`, never the training buffer) and `pop_eval_results()` reports a version's success rate
once all of its eval tasks returned.

Order: re-leases first, then queued evaluation, then fresh training tasks in a per-epoch shuffle that depends only
on (seed, epoch), so `state_dict()` = (epoch, position, outstanding work) reproduces the order after a restart.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
import uuid
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from sao.transport import dispenser_state
from sao.transport.evaluation import EvalCollector, EvalResult
from sao.transport.lease_table import LeaseTable
from sao.transport.leases import DispenserConfig, Group, Lease, Work
from sao.transport.task_catalog import encode_tasks, epoch_order
from sao.transport.trajectory import ReasonCode, Trajectory, TrajectoryError

logger = logging.getLogger(__name__)

class TaskDispenser:
  """Leases training and validation tasks to rollout workers (see the module docstring).

  Args:
    tasks: training tasks, JSON-serialisable dicts with a unique `config.id_key`.
    config: a `DispenserConfig`.
    validation_tasks: the validation split (same format), evaluated every `config.eval_every` versions.
    clock: seconds, monotonic; injectable so tests need no sleeping.
  """

  def __init__(self, tasks: Sequence[Mapping[str, Any]], config: DispenserConfig | None = None,
               validation_tasks: Sequence[Mapping[str, Any]] = (), clock: Callable[[], float] = time.monotonic):
    self.config = config or DispenserConfig()
    if not tasks:
      raise ValueError("TaskDispenser needs at least one training task")
    self._clock = clock
    self._lock = threading.RLock()
    self._splits = {False: encode_tasks(tasks, self.config.id_key, "tasks"),
                    True: encode_tasks(validation_tasks, self.config.id_key, "validation_tasks")}
    self._epoch = 0
    self._position = 0
    self._order = self._permutation(0)
    self._policy_version = 0
    self._retry: collections.deque[Work] = collections.deque()
    self._eval_queue: collections.deque[Work] = collections.deque()
    self._leases = LeaseTable()
    self._groups: dict[str, Group] = {}
    self._evals = EvalCollector(self.config.success_threshold)

  def _permutation(self, epoch: int) -> np.ndarray:
    """The task order of `epoch` (`task_catalog.epoch_order`: no RNG state to checkpoint)."""
    return epoch_order(self.config.seed, epoch, len(self._splits[False]))

  # ----------------------------------------------------------------------------------------------------------------
  # Leasing.

  def lease(self, worker_id: str, max_tasks: int) -> list[Lease]:
    """Up to `max_tasks` new leases for `worker_id` (fewer, possibly none, when no work is available)."""
    with self._lock:
      self._expire(self._clock())
      out = []
      while len(out) < max_tasks:
        work = self._next_work()
        if work is None:
          break
        out.append(self._issue(worker_id, work))
      return out

  def _next_work(self) -> Work | None:
    while self._retry:
      work = self._retry.popleft()
      group = self._groups.get(work.group_id)
      # Samples accepted after the lease expired (a submission already in flight) need no re-run.
      missing = tuple(i for i in work.sample_indices if group is not None and i not in group.accepted)
      if missing:
        return dataclasses.replace(work, sample_indices=missing)
    if self._eval_queue:
      return self._eval_queue.popleft()
    return self._next_fresh()

  def _next_fresh(self) -> Work | None:
    if self.config.num_epochs is not None and self._epoch >= self.config.num_epochs:
      return None
    index = int(self._order[self._position])
    task_id = self._splits[False][index][0]
    work = Work(index, False, f"e{self._epoch}:{task_id}", tuple(range(self.config.group_size)))
    self._groups[work.group_id] = Group(self.config.group_size)
    self._position += 1
    if self._position == len(self._order):
      self._epoch += 1
      self._position = 0
      self._order = self._permutation(self._epoch)
    return work

  def _issue(self, worker_id: str, work: Work, lease_id: str | None = None,
             expires_at: float | None = None) -> Lease:
    task_id, task_json = self._splits[work.is_validation][work.task_index]
    temperature = self.config.eval_temperature if work.is_validation else self.config.train_temperature
    lease = Lease(
        lease_id=lease_id or uuid.uuid4().hex, worker_id=worker_id, task_id=task_id, task_json=task_json,
        group_id=work.group_id, sample_indices=work.sample_indices, is_validation=work.is_validation,
        temperature=temperature, env_name=self.config.env_name, eval_version=work.eval_version,
        expires_at=self._clock() + self.config.lease_ttl_s if expires_at is None else expires_at, work=work,
        pending=set(work.sample_indices))
    self._leases.add(lease)
    return lease

  def _expire(self, now: float) -> None:
    # A lease with a submission in flight is held (`LeaseTable.pop_expired`): it expires once the submission ends.
    for lease in self._leases.pop_expired(now):
      missing = tuple(sorted(lease.pending))
      logger.info("lease %s (task %s, worker %s) expired with samples %s missing; re-leasing them",
                  lease.lease_id, lease.task_id, lease.worker_id, missing)
      self._retry.append(dataclasses.replace(lease.work, sample_indices=missing))

  def heartbeat(self, lease_ids: Sequence[str], worker_id: str | None = None) -> tuple[list[str], list[str]]:
    """Extends live leases by `lease_ttl_s`; returns (extended, expired-or-unknown) lease ids. With `worker_id`,
    a lease held by another worker is not extended and is reported with the expired ones."""
    with self._lock:
      now = self._clock()
      self._expire(now)
      extended, expired = [], []
      for lease_id in lease_ids:
        lease = self._leases.get(lease_id)
        if lease is None or (worker_id is not None and lease.worker_id != worker_id):
          expired.append(lease_id)
        else:
          lease.expires_at = now + self.config.lease_ttl_s
          extended.append(lease_id)
      return extended, expired

  # ----------------------------------------------------------------------------------------------------------------
  # Submissions (the server validates the record; the dispenser checks the lease and does the bookkeeping).

  def begin_submission(self, traj: Trajectory, worker_id: str | None = None) -> Lease:
    """Checks that `traj` belongs to a live lease (held by `worker_id`, when given) and holds that lease against
    expiry until `complete` or `abort_submission` (module docstring); returns the lease.

    Raises `TrajectoryError`: UNKNOWN_LEASE (unknown/expired lease, sample index not in it, or that sample already
    in submission), WRONG_WORKER, INVALID_FIELD (task or group id does not match the lease).
    """
    with self._lock:
      self._expire(self._clock())
      lease = self._leases.get(traj.lease_id)
      if lease is None:
        raise TrajectoryError("lease_id", ReasonCode.UNKNOWN_LEASE,
                              f"lease {traj.lease_id!r} is unknown or expired (its work is re-leased)")
      if worker_id is not None and lease.worker_id != worker_id:
        raise TrajectoryError("worker_id", ReasonCode.WRONG_WORKER,
                              f"lease {traj.lease_id!r} is held by worker {lease.worker_id!r}, not {worker_id!r}")
      if traj.sample_index not in lease.pending:
        raise TrajectoryError("sample_index", ReasonCode.UNKNOWN_LEASE,
                              f"sample_index {traj.sample_index} is not an outstanding sample of lease "
                              f"{traj.lease_id!r} (pending {sorted(lease.pending)})")
      if traj.sample_index in lease.submitting:
        raise TrajectoryError("sample_index", ReasonCode.UNKNOWN_LEASE,
                              f"sample {traj.sample_index} of lease {traj.lease_id!r} is already being submitted")
      if traj.task_id != lease.task_id:
        raise TrajectoryError("task_id", ReasonCode.INVALID_FIELD,
                              f"{traj.task_id!r} does not match lease {traj.lease_id!r}'s task {lease.task_id!r}")
      if traj.group_id and traj.group_id != lease.group_id:
        raise TrajectoryError("group_id", ReasonCode.INVALID_FIELD,
                              f"{traj.group_id!r} does not match lease {traj.lease_id!r}'s group {lease.group_id!r}")
      lease.submitting.add(traj.sample_index)
      return lease

  def abort_submission(self, lease: Lease, traj: Trajectory) -> None:
    """Ends a `begin_submission` whose record was not stored: the sample is outstanding again, and the lease expires
    as usual (at once, if it is past its expiry)."""
    with self._lock:
      lease.submitting.discard(traj.sample_index)
      self._expire(self._clock())

  def reject_submission(self, lease: Lease, traj: Trajectory) -> None:
    """Ends a `begin_submission` whose sample was rejected for good (STALE_POLICY: generated by a policy too old to
    train on): the sample leaves its lease and is re-leased at once. Left to lease expiry instead, it would hold a
    flow-control slot (`max_outstanding` counts live leases) for up to `lease_ttl_s` — hours in the full configs —
    after the worker has stopped heartbeating it."""
    with self._lock:
      lease.submitting.discard(traj.sample_index)
      if traj.sample_index not in lease.pending:
        return
      self._leases.settle(lease, traj.sample_index)
      logger.info("sample %d of lease %s (task %s) rejected as stale; re-leasing it", traj.sample_index,
                  lease.lease_id, lease.task_id)
      self._retry.append(dataclasses.replace(lease.work, sample_indices=(traj.sample_index,)))

  def complete(self, lease: Lease, traj: Trajectory) -> bool:
    """Ends a `begin_submission` whose record is durable: the sample is accepted. True when it completes its
    group (all G samples accepted)."""
    with self._lock:
      lease.submitting.discard(traj.sample_index)
      self._leases.settle(lease, traj.sample_index)
      group = self._groups.get(lease.group_id)
      if group is None or traj.sample_index in group.accepted:
        # Cannot happen through begin_submission (the hold keeps the sample from being re-leased); kept loud.
        logger.warning("sample %d of group %s completed twice or after its group finished; ignored",
                       traj.sample_index, lease.group_id)
        return False
      group.accepted.add(traj.sample_index)
      if len(group.accepted) < group.size:
        return False
      del self._groups[lease.group_id]
      if lease.is_validation:
        self._evals.record(lease.eval_version, lease.group_id, traj.reward, traj.harness)
      return True

  def restore_sample(self, traj: Trajectory) -> bool | None:
    """Re-applies a logged, accepted training sample after a restart (the dispenser state may predate it).

    Returns None when `traj.group_id` is not an open group of this dispenser (the caller drops a partial group
    then: its task is, or will be, leased afresh), else whether the group is now complete.
    """
    with self._lock:
      group = self._groups.get(traj.group_id)
      if group is None:
        return None
      live = self._leases.get(traj.lease_id)
      if live is not None:
        self._leases.settle(live, traj.sample_index)
      # A pending re-lease of this group skips the index itself (`_next_work` filters by `group.accepted`).
      group.accepted.add(traj.sample_index)
      if len(group.accepted) < group.size:
        return False
      del self._groups[traj.group_id]
      return True

  # ----------------------------------------------------------------------------------------------------------------
  # Policy versions and evaluation.

  def set_policy_version(self, version: int) -> None:
    """Records the trainer's policy version; queues an evaluation when `version % eval_every == 0`."""
    with self._lock:
      self._policy_version = int(version)
      if self.config.eval_every and version % self.config.eval_every == 0:
        self.schedule_eval(version)

  def schedule_eval(self, version: int, repeats: int = 1) -> bool:
    """Queues the whole validation split for `version` (once per version), each task `repeats` times (more episodes,
    a more precise success rate: the base policy's is the reference every later one is compared with); False if
    nothing was queued."""
    if repeats < 1:
      raise ValueError(f"repeats: must be >= 1, got {repeats}")
    with self._lock:
      val = self._splits[True]
      if not val or not self._evals.start(version, len(val) * repeats):
        return False
      for repeat in range(repeats):
        for index, (task_id, _) in enumerate(val):
          group_id = f"eval{version}:{task_id}" + (f"#r{repeat}" if repeat else "")
          self._groups[group_id] = Group(1)
          self._eval_queue.append(Work(index, True, group_id, (0,), version))
      return True

  def pop_eval_results(self) -> list[EvalResult]:
    """Evaluations finished since the last call, in completion order."""
    with self._lock:
      return self._evals.pop()

  def eval_result(self, version: int) -> EvalResult | None:
    with self._lock:
      return self._evals.result(version)

  # ----------------------------------------------------------------------------------------------------------------
  # Introspection.

  @property
  def policy_version(self) -> int:
    return self._policy_version

  @property
  def epoch(self) -> int:
    return self._epoch

  @property
  def num_leased(self) -> int:
    with self._lock:
      return len(self._leases)

  def leased_samples(self, excluding: Iterable[str] = ()) -> int:
    """Samples the live leases hold that are not accepted yet (`Lease.pending`: a re-leased part of a group counts
    only its missing samples), leaving out the groups in `excluding` (for flow control: the groups whose buffer
    reservation already counts them, `sao.transport.flow.outstanding_samples`). O(len(excluding))."""
    with self._lock:
      return self._leases.leased_samples(excluding)

  def lease_info(self, lease_id: str) -> Lease | None:
    with self._lock:
      return self._leases.get(lease_id)

  def group_size_of(self, group_id: str) -> int:
    """G for a training group id, 1 for an eval group (independent of whether the group is still open)."""
    return 1 if group_id.startswith("eval") else self.config.group_size

  @property
  def exhausted(self) -> bool:
    """All epochs leased and nothing outstanding (no lease, re-lease, queued eval or open group)."""
    with self._lock:
      self._expire(self._clock())
      return (self.config.num_epochs is not None and self._epoch >= self.config.num_epochs and not self._leases
              and not self._retry and not self._eval_queue and not self._groups)

  # ----------------------------------------------------------------------------------------------------------------
  # Checkpointing.

  def state_dict(self) -> dict[str, Any]:
    """JSON-serialisable state (`sao.transport.dispenser_state`): epoch, position, policy version, outstanding leases
    (with the TTL they have left), open groups, pending re-leases and evaluations. The shuffle is a function of
    (seed, epoch), so that is its RNG.
    """
    with self._lock:
      now = self._clock()
      return {
          **self._identity(),
          "epoch": self._epoch, "position": self._position, "policy_version": self._policy_version,
          "retry": [dispenser_state.work_record(w) for w in self._retry],
          "eval_queue": [dispenser_state.work_record(w) for w in self._eval_queue],
          "leases": [dispenser_state.lease_record(l, now) for l in self._leases],
          "groups": {gid: dispenser_state.group_record(g) for gid, g in self._groups.items()},
          **self._evals.state_dict(),
      }

  def _identity(self) -> dict[str, Any]:
    c = self.config
    return dispenser_state.identity(c.seed, len(self._splits[False]), c.mode, c.group_size)

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    """Restores `state_dict()` output; the task lists and config must match the ones it was taken with."""
    dispenser_state.check_identity(state, self._identity())
    work = dispenser_state.work_from_record
    with self._lock:
      now = self._clock()
      self._epoch, self._position = int(state["epoch"]), int(state["position"])
      self._order = self._permutation(self._epoch)
      self._policy_version = int(state["policy_version"])
      self._retry = collections.deque(work(w) for w in state["retry"])
      self._eval_queue = collections.deque(work(w) for w in state["eval_queue"])
      self._groups = {gid: dispenser_state.group_from_record(g) for gid, g in state["groups"].items()}
      self._leases = LeaseTable()
      for l in state["leases"]:
        lease = self._issue(l["worker_id"], work(l["work"]), lease_id=l["lease_id"],
                            expires_at=now + float(l["ttl_left_s"]))
        self._leases.set_pending(lease, l["pending"])
      self._evals.load_state_dict(state)
