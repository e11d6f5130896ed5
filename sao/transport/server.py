"""The trainer-side gRPC `TrajectoryService`: leases tasks, validates and durably stores trajectories, buffers them.

A submitted trajectory is accepted only if (in this order) it decodes, its content is one the learner can take
(`Trajectory.validate` and the trainer's `admission.ContentLimits`: length, reward and log-prob ranges, a policy
version no newer than the trainer published), it is not a re-send of an accepted one (a valid re-send is
acknowledged as accepted with reason DUPLICATE and counted once: submissions are idempotent by
(lease_id, sample_index)), its lease is live and held by the submitting worker (`TaskDispenser.begin_submission`,
which also holds the lease against expiry until the record is stored), its
`policy_version >= current_version - max_staleness`, and the bounded buffer has room (else BACKPRESSURE with
`retry_after_ms`). Accepted training trajectories are appended to the durable log (one fsync per request) *before*
the response goes out, then buffered. Validation trajectories go to the dispenser's eval collector instead.

The parts live in their own modules: the bounded buffer with group reservations (`group_buffer`), the restart
from the log (`restore`), the token check (`auth`), the content limits (`admission`), leasing (`dispenser`,
`leases`), flow control and the admission steps (`flow`) and validation results (`evaluation`); the durable log and
its ledgers (`log`, `ledger`).

Submissions are serialised by one lock (their cost is the fsync); `take_batch` waits on a separate condition so
the learner is never blocked behind a disk write.
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from typing import Any, Mapping, Sequence

import grpc

from sao.transport import flow
from sao.transport import log as log_lib
from sao.transport import sao_pb2
from sao.transport import sao_pb2_grpc
from sao.transport.auth import TokenInterceptor, is_loopback
from sao.transport.dispenser import TaskDispenser
from sao.transport.evaluation import EvalResult
from sao.transport.group_buffer import GroupBuffer
from sao.transport.leases import Lease
from sao.transport.restore import restore_buffer
from sao.transport.server_config import ServerConfig
from sao.transport.trajectory import ReasonCode, Trajectory, TrajectoryError, field_summary, reject_result

logger = logging.getLogger(__name__)


class TrajectoryServer(sao_pb2_grpc.TrajectoryServiceServicer):
  """The gRPC service plus the learner-side API (`take_batch`, `mark_consumed`, `set_policy_version`, `restore`).

  Usage: `server = TrajectoryServer(config, dispenser); server.restore(dispenser_state); server.start(); ...;
  server.stop()`. `start()` restores from the log itself if `restore` was not called.
  """

  def __init__(self, config: ServerConfig, dispenser: TaskDispenser):
    self.config = config
    self.dispenser = dispenser
    self._submit_lock = threading.Lock()
    self._cond = threading.Condition()
    self._buffer = GroupBuffer(config.buffer_capacity)
    self._accepted_keys: set[log_lib.SampleKey] = set()
    self._version = dispenser.policy_version
    self._max_version = self._version  # the newest version engines may serve (`announce_policy_version`)
    self._limits = config.content_limits()
    self._counts: collections.Counter[str] = collections.Counter()
    self._rejected: collections.Counter[str] = collections.Counter()
    self._max_occupancy = 0
    self._max_outstanding = config.max_outstanding  # `set_max_outstanding` (sao.transport.staleness_control) moves it
    self._log: log_lib.TrajectoryLog | None = None
    self._ledger: log_lib.ConsumedLedger | None = None
    self._quarantine = log_lib.QuarantineLedger(config.log_dir)
    self._grpc: grpc.Server | None = None
    self._restored = False
    self.port: int | None = None

  # ----------------------------------------------------------------------------------------------------------------
  # Lifecycle.

  def restore(self, dispenser_state: Mapping[str, Any] | None = None) -> int:
    """Loads the dispenser checkpoint (if given), then reloads accepted-but-unconsumed trajectories from the log
    into the buffer and remembers every logged key (so re-sends stay duplicates). Returns the number buffered.

    See `sao.transport.restore` for partial groups and the capacity.
    """
    if self._grpc is not None:
      raise RuntimeError("restore() must be called before start()")
    if dispenser_state is not None:
      self.dispenser.load_state_dict(dispenser_state)
      self._version = self.dispenser.policy_version
      self._max_version = max(self._max_version, self._version)
    with self._cond:
      result = restore_buffer(self.config.log_dir, self.dispenser, self._buffer, self._limits)
      self._accepted_keys = result.accepted_keys
      self._counts["accepted"] = len(result.accepted_keys)
      self._counts["consumed"] = result.num_consumed + len(result.to_quarantine)
      self._counts["restore_dropped"] = result.num_dropped
      self._counts["log_skipped_spans"] = result.log_report.skipped_spans
      self._counts["log_skipped_bytes"] = result.log_report.skipped_bytes
      self._counts["log_undecodable"] = result.log_report.undecodable
      self._restored = True
    if result.to_quarantine:
      self.quarantine([(t, f"at restore: {e}") for t, e in result.to_quarantine], step=-1)
    with self._cond:
      logger.info("restore from %s: %d accepted keys, %d consumed, %d buffered", self.config.log_dir,
                  len(self._accepted_keys), self._counts["consumed"], self._buffer.held)
      return self._buffer.held

  def start(self) -> int:
    """Binds and starts serving; returns the bound port. Refuses a non-loopback host without a token."""
    cfg = self.config
    if not is_loopback(cfg.host) and not cfg.token:
      raise ValueError(f"refusing to bind non-loopback host {cfg.host!r} without ServerConfig.token")
    if not self._restored:
      self.restore()
    self._log = log_lib.TrajectoryLog(cfg.log_dir, segment_bytes=cfg.segment_bytes)
    self._ledger = log_lib.ConsumedLedger(cfg.log_dir)
    server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=cfg.max_workers, thread_name_prefix="sao-transport"),
        interceptors=[TokenInterceptor(cfg.token)] if cfg.token else None,
        # so_reuseport 0: a second server on a port still in use must fail, not silently share it.
        options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", cfg.max_message_bytes)])
    sao_pb2_grpc.add_TrajectoryServiceServicer_to_server(self, server)
    host = f"[{cfg.host}]" if ":" in cfg.host and not cfg.host.startswith("[") else cfg.host
    address = f"{host}:{cfg.port}"
    try:
      if cfg.tls_cert_path:
        with open(cfg.tls_key_path, "rb") as k, open(cfg.tls_cert_path, "rb") as c:
          creds = grpc.ssl_server_credentials([(k.read(), c.read())])
        port = server.add_secure_port(address, creds)
      else:
        port = server.add_insecure_port(address)
    except RuntimeError as e:
      raise OSError(f"cannot bind TrajectoryService to {address}: {e}") from e
    if port == 0:
      raise OSError(f"cannot bind TrajectoryService to {address}")
    server.start()
    self._grpc, self.port = server, port
    logger.info("TrajectoryService on %s:%d (tls=%s, token=%s)", cfg.host, port, bool(cfg.tls_cert_path),
                bool(cfg.token))
    return port

  def stop(self, grace_s: float | None = 1.0) -> None:
    """Stops serving (in-flight calls get `grace_s`), then closes the log and ledger."""
    if self._grpc is not None:
      self._grpc.stop(grace_s).wait(timeout=(grace_s or 0) + 5)
      self._grpc = None
    with self._submit_lock:
      for f in (self._log, self._ledger, self._quarantine):
        if f is not None:
          f.close()
      self._log = self._ledger = None

  # ----------------------------------------------------------------------------------------------------------------
  # Learner-side API.

  def announce_policy_version(self, version: int) -> None:
    """Engines are about to load `version`: trajectories tagged with it are accepted from now on (before, they are
    FUTURE_POLICY). Call it before telling the engines, then `set_policy_version` once they serve it."""
    with self._cond:
      self._max_version = max(self._max_version, int(version))

  def set_policy_version(self, version: int) -> None:
    """The policy version engines now serve: the staleness bound moves, evaluations get scheduled."""
    with self._cond:
      self._version = int(version)
      self._max_version = max(self._max_version, self._version)
      self.dispenser.set_policy_version(version)

  def set_max_outstanding(self, samples: int) -> None:
    """The flow-control bound from now on (`sao.transport.staleness_control`); only with flow control on."""
    if not self.config.max_outstanding or samples <= 0:
      raise ValueError(f"set_max_outstanding: needs flow control on and samples > 0, got {samples} (configured "
                       f"max_outstanding {self.config.max_outstanding})")
    with self._cond:
      self._max_outstanding = int(samples)

  @property
  def policy_version(self) -> int:
    return self._version

  def take_batch(self, n: int, timeout_s: float) -> list[Trajectory]:
    """The first `n` finished trajectories (group mode: the first n/G complete groups, each group's G together,
    ordered by sample index), or [] if that many are not ready within `timeout_s`. Includes non-trainable
    statuses (timeout, env_error): the learner filters them (`Trajectory.is_trainable`)."""
    size = self.dispenser.config.group_size
    if n <= 0 or n % size:
      raise ValueError(f"take_batch: n must be a positive multiple of the group size {size}, got {n}")
    deadline = time.monotonic() + timeout_s
    with self._cond:
      while True:
        batch = self._buffer.take(n)
        if batch is not None:
          self._counts["in_learner"] += len(batch)
          return batch
        remaining = deadline - time.monotonic()
        if remaining <= 0:
          return []
        self._cond.wait(remaining)

  def mark_consumed(self, trajs: Sequence[Trajectory], step: int) -> None:
    """Records (fsynced) that the learner trained on `trajs` at `step`; they will not be restored after a restart."""
    if self._ledger is None:
      raise RuntimeError("mark_consumed before start()")
    self._ledger.mark([log_lib.sample_key(t) for t in trajs], step)
    with self._cond:
      self._counts["consumed"] += len(trajs)
      self._counts["in_learner"] -= len(trajs)

  def quarantine(self, records: Sequence[tuple[Trajectory, str]], step: int) -> None:
    """Sets aside accepted records the learner cannot use, each with its reason: logged, counted (`quarantined`)
    and persisted (fsynced) in the log directory, so no restart ever buffers them again. `step` is the trainer
    step that found them (-1: the restore). The learner still `mark_consumed`s them with the rest of its batch."""
    if not records:
      return
    for traj, reason in records:
      logger.error("quarantined trajectory (lease %r, sample %d, task %r): %s", traj.lease_id, traj.sample_index,
                   traj.task_id, reason)
    self._quarantine.add([(log_lib.sample_key(t), reason, field_summary(t)) for t, reason in records], step)
    with self._cond:
      self._counts["quarantined"] += len(records)

  def eval_results(self) -> list[EvalResult]:
    """Evaluations that finished since the last call (`TaskDispenser.pop_eval_results`)."""
    return self.dispenser.pop_eval_results()

  def stats(self) -> dict[str, Any]:
    """Counters: accepted, duplicates, rejected (by reason), buffered, consumed (quarantined ones included),
    in_learner, leased, occupancy, quarantined, the flow-control bound now and the lease calls it refused
    (`lease_throttled`), and what the last restore lost reading the log."""
    with self._cond:
      return {"policy_version": self._version, "accepted": self._counts["accepted"],
              "duplicates": self._counts["duplicates"], "eval_accepted": self._counts["eval_accepted"],
              "rejected": sum(self._rejected.values()),
              "rejected_by_reason": dict(self._rejected), "buffered": self._buffer.held,
              "consumed": self._counts["consumed"], "in_learner": self._counts["in_learner"],
              "leased": self.dispenser.num_leased, "occupancy": self._buffer.occupancy,
              "max_occupancy": self._max_occupancy, "buffer_capacity": self.config.buffer_capacity,
              "max_outstanding": self._max_outstanding, "lease_throttled": self._counts["lease_throttled"],
              "quarantined": self._counts["quarantined"], "restore_dropped": self._counts["restore_dropped"],
              "log_skipped_spans": self._counts["log_skipped_spans"],
              "log_skipped_bytes": self._counts["log_skipped_bytes"],
              "log_undecodable": self._counts["log_undecodable"]}

  # ----------------------------------------------------------------------------------------------------------------
  # gRPC handlers.

  def LeaseTasks(self, request: sao_pb2.LeaseRequest, context) -> sao_pb2.LeaseResponse:
    if request.max_tasks <= 0:
      context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"max_tasks must be > 0, got {request.max_tasks}")
    max_tasks = min(request.max_tasks, self.config.max_lease_per_call)
    if self.config.max_outstanding:
      # Flow control (`flow.lease_allowance`): rollouts run at most `max_outstanding` samples ahead of the learner.
      with self._cond:  # one snapshot: a sample moves from leased to buffered under this condition
        outstanding = flow.outstanding_samples(self.dispenser, self._buffer)
        bound = self._max_outstanding
      max_tasks = flow.lease_allowance(max_tasks, bound, outstanding, self.dispenser.config.group_size)
      if max_tasks <= 0:
        with self._cond:
          self._counts["lease_throttled"] += 1
        return sao_pb2.LeaseResponse(policy_version=self._version, engine_urls=self.config.engine_urls,
                                     retry_after_ms=self.config.backpressure_retry_ms)
    leases = self.dispenser.lease(request.worker_id, max_tasks)
    ttl_ms = int(self.dispenser.config.lease_ttl_s * 1000)
    tasks = [sao_pb2.LeasedTask(
        lease_id=l.lease_id, task_id=l.task_id, task_json=l.task_json, group_id=l.group_id,
        num_samples=l.num_samples, sample_indices=l.sample_indices, is_validation=l.is_validation,
        temperature=l.temperature, env_name=l.env_name, lease_ttl_ms=ttl_ms) for l in leases]
    return sao_pb2.LeaseResponse(tasks=tasks, policy_version=self._version, engine_urls=self.config.engine_urls,
                                 retry_after_ms=0 if tasks else self.config.no_work_retry_ms)

  def Heartbeat(self, request: sao_pb2.HeartbeatRequest, context) -> sao_pb2.HeartbeatResponse:
    extended, expired = self.dispenser.heartbeat(list(request.lease_ids), request.worker_id)
    return sao_pb2.HeartbeatResponse(extended_lease_ids=extended, expired_lease_ids=expired,
                                     policy_version=self._version)

  def GetStatus(self, request: sao_pb2.StatusRequest, context) -> sao_pb2.StatusResponse:
    s = self.stats()
    return sao_pb2.StatusResponse(
        policy_version=s["policy_version"], buffered=s["buffered"], accepted=s["accepted"], rejected=s["rejected"],
        leased=s["leased"], duplicates=s["duplicates"], consumed=s["consumed"],
        rejected_by_reason=s["rejected_by_reason"], in_learner=s["in_learner"],
        buffer_capacity=s["buffer_capacity"])

  def SubmitTrajectories(self, request: sao_pb2.SubmitRequest, context) -> sao_pb2.SubmitResponse:
    with self._submit_lock:
      results = self._submit(request)
    with self._cond:
      for r in results:
        if not r.accepted:
          self._rejected[sao_pb2.RejectReason.Name(r.reason).removeprefix("REJECT_REASON_")] += 1
    return sao_pb2.SubmitResponse(results=results, policy_version=self._version)

  def _submit(self, request: sao_pb2.SubmitRequest) -> list[sao_pb2.SubmitResult]:
    """Admits, logs and buffers one request's trajectories (under the submit lock)."""
    if self._log is None:
      err = TrajectoryError("trajectories", ReasonCode.INTERNAL, "server is stopping")
      return [reject_result(err, self.config.backpressure_retry_ms) for _ in request.trajectories]
    results: list[sao_pb2.SubmitResult | None] = [None] * len(request.trajectories)
    first_of: dict[log_lib.SampleKey, int] = {}
    admitted: list[tuple[int, Trajectory, Lease]] = []
    for i, msg in enumerate(request.trajectories):
      key = (msg.lease_id, msg.sample_index)
      if key in first_of:
        continue  # same key twice in one request: gets the first copy's verdict below
      first_of[key] = i
      try:
        traj = Trajectory.from_proto(msg)
        # Content first, even for a re-send: an invalid record is never acknowledged, DUPLICATE or not.
        self._limits.check(traj, self._max_version)
        if key in self._accepted_keys:
          results[i] = sao_pb2.SubmitResult(accepted=True, reason=sao_pb2.REJECT_REASON_DUPLICATE,
                                            message=f"already accepted: lease {key[0]!r} sample {key[1]}")
          continue
        lease = self._admit(traj, request.worker_id)
      except TrajectoryError as e:
        retry = self.config.backpressure_retry_ms if e.reason_code == ReasonCode.BACKPRESSURE else 0
        results[i] = reject_result(e, retry)
        continue
      except Exception as e:  # a server bug must cost this trajectory, not the whole request or the server
        logger.exception("admitting trajectory (lease %r, sample %d) failed", key[0], key[1])
        results[i] = reject_result(TrajectoryError("trajectories", ReasonCode.INTERNAL, repr(e)))
        continue
      admitted.append((i, traj, lease))
    try:
      self._log.append_batch([t for _, t, lease in admitted if not lease.is_validation])
    except Exception as e:  # a disk error must not be acknowledged: the worker retries later
      logger.exception("trajectory log append of %d trajectories failed; rejecting them as INTERNAL", len(admitted))
      for _, t, lease in admitted:
        self.dispenser.abort_submission(lease, t)
      with self._cond:
        for _, t, _ in admitted:
          self._buffer.release_if_empty(t.group_id)
      err = TrajectoryError("trajectories", ReasonCode.INTERNAL, f"log append failed: {e}")
      for i, _, _ in admitted:
        results[i] = reject_result(err, self.config.backpressure_retry_ms)
    else:
      with self._cond:
        for i, traj, lease in admitted:
          self._accepted_keys.add((traj.lease_id, traj.sample_index))
          if flow.accept(self.dispenser, self._buffer, lease, traj):
            self._counts["accepted"] += 1
          else:
            self._counts["eval_accepted"] += 1
          results[i] = sao_pb2.SubmitResult(accepted=True)
        self._max_occupancy = max(self._max_occupancy, self._buffer.occupancy)
        self._cond.notify_all()
    for i, msg in enumerate(request.trajectories):
      if results[i] is None:  # a repeat within the request: counted once, acknowledged like the first copy
        first = results[first_of[(msg.lease_id, msg.sample_index)]]
        results[i] = first if not first.accepted else sao_pb2.SubmitResult(
            accepted=True, reason=sao_pb2.REJECT_REASON_DUPLICATE, message="repeated within the request")
    with self._cond:
      self._counts["duplicates"] += sum(1 for r in results if r.accepted and r.reason)
    return results

  def _admit(self, traj: Trajectory, worker_id: str) -> Lease:
    """`flow.admit` at the current version, reserving under the buffer's condition; raises `TrajectoryError`."""
    return flow.admit(self.dispenser, self._buffer, traj, worker_id, self._version, self.config.max_staleness,
                      self._cond)
