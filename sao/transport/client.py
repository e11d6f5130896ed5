"""The worker-side client of the trainer's `TrajectoryService`.

`submit` keeps every trajectory until the trainer acknowledged it (accepted, or accepted-duplicate) or rejected it
permanently, and re-sends the rest: after a transport error it reconnects with exponential backoff (with jitter,
so many workers do not retry in lock step), after BACKPRESSURE/INTERNAL it waits the server's `retry_after_ms`.
Re-sending is safe because the server is idempotent by (lease_id, sample_index). Retrying is bounded by
`retry_budget_s` per call; what is still unacknowledged then stays in the client and goes out with the next
`submit`/`flush`.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import random
import threading
import time
import uuid
from typing import Sequence

import grpc

from sao.transport import sao_pb2
from sao.transport import sao_pb2_grpc
from sao.transport.auth import AUTH_METADATA_KEY
from sao.transport.trajectory import ReasonCode, Trajectory

logger = logging.getLogger(__name__)

# Errors after which the same call may succeed later (server restarting, overloaded, slow).
_TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED,
              grpc.StatusCode.ABORTED)


@dataclasses.dataclass(frozen=True)
class SubmitOutcome:
  """The trainer's verdict on one submitted trajectory.

  Attributes:
    lease_id, sample_index: the trajectory's idempotency key.
    accepted: stored by the trainer (`duplicate` when an earlier send had already been accepted).
    reason: `ReasonCode.NONE` when accepted fresh; the reject reason otherwise.
    message, field: the server's explanation and the offending field.
    pending: not acknowledged within the retry budget; the client keeps it and re-sends it on the next call.
  """
  lease_id: str
  sample_index: int
  accepted: bool
  duplicate: bool = False
  reason: ReasonCode = ReasonCode.NONE
  message: str = ""
  field: str = ""
  pending: bool = False


class TrajectoryClient:
  """Talks to one `TrajectoryServer`.

  Args:
    address: "host:port".
    token: the server's shared secret (sent as `authorization: Bearer <token>` metadata).
    tls_root_cert: PEM bytes or a path to them; switches the channel to TLS.
    worker_id: reported to the server (default: a random id).
    rpc_timeout_s: deadline of one RPC.
    retry_budget_s: how long one call keeps retrying transient failures.
    min_rpc_timeout_s: the shortest deadline an RPC gets when less of its call's budget is left (an RPC sent with a
      budget's last milliseconds times out on a loaded machine after the server stored its trajectories, and their
      re-send comes back as duplicates).
    initial_backoff_s, max_backoff_s: reconnect backoff (doubling, jittered).
    max_batch: trajectories per SubmitTrajectories request.
  """

  def __init__(self, address: str, token: str | None = None, tls_root_cert: bytes | str | None = None, *,
               worker_id: str | None = None, rpc_timeout_s: float = 30.0, retry_budget_s: float = 60.0,
               min_rpc_timeout_s: float = 5.0, initial_backoff_s: float = 0.05, max_backoff_s: float = 2.0,
               max_batch: int = 64, max_message_bytes: int = 64 << 20):
    if not 0 < min_rpc_timeout_s <= rpc_timeout_s:
      raise ValueError(f"min_rpc_timeout_s must lie in (0, rpc_timeout_s={rpc_timeout_s}], got {min_rpc_timeout_s}")
    self.address = address
    self.worker_id = worker_id or f"worker-{uuid.uuid4().hex[:8]}"
    self.rpc_timeout_s = rpc_timeout_s
    self.min_rpc_timeout_s = min_rpc_timeout_s
    self.retry_budget_s = retry_budget_s
    self.initial_backoff_s = initial_backoff_s
    self.max_backoff_s = max_backoff_s
    self.max_batch = max_batch
    self._metadata = ((AUTH_METADATA_KEY, f"Bearer {token}"),) if token else ()
    if isinstance(tls_root_cert, (str, os.PathLike)):
      with open(tls_root_cert, "rb") as f:
        tls_root_cert = f.read()
    self._tls_root_cert = tls_root_cert
    self._options = [("grpc.max_send_message_length", max_message_bytes),
                     ("grpc.max_receive_message_length", max_message_bytes)]
    self._rng = random.Random()
    self._cancelled = threading.Event()
    self._unacked: dict[tuple[str, int], sao_pb2.Trajectory] = {}
    self._late: list[SubmitOutcome] = []
    self._channel: grpc.Channel | None = None
    self._stub: sao_pb2_grpc.TrajectoryServiceStub | None = None
    # One client is shared by a worker's lease, heartbeat and submit threads. A reconnect must not cancel the other
    # threads' calls in flight on the old channel: a replaced channel is closed when its last call returns.
    self._lock = threading.Lock()
    self._in_flight: dict[int, int] = {}  # id(channel) -> calls in flight on it
    self._retired: dict[int, grpc.Channel] = {}  # replaced channels still carrying calls
    self._connect()

  def _new_channel(self) -> grpc.Channel:
    if self._tls_root_cert is not None:
      creds = grpc.ssl_channel_credentials(root_certificates=self._tls_root_cert)
      return grpc.secure_channel(self.address, creds, options=self._options)
    return grpc.insecure_channel(self.address, options=self._options)

  def _connect(self, failed: grpc.Channel | None = None) -> None:
    """A fresh channel. With `failed`, only when that channel is still the current one (another thread may have
    reconnected already); the replaced channel is closed once no call is in flight on it."""
    with self._lock:
      old = self._channel
      if failed is not None and old is not failed:
        return
      self._channel = self._new_channel()
      self._stub = sao_pb2_grpc.TrajectoryServiceStub(self._channel)
      if old is not None:
        if self._in_flight.get(id(old)):
          self._retired[id(old)] = old
          old = None
    if old is not None:
      old.close()

  def _acquire(self) -> tuple[grpc.Channel, sao_pb2_grpc.TrajectoryServiceStub]:
    with self._lock:
      if self._channel is None:
        raise RuntimeError(f"TrajectoryClient({self.address}) is closed")
      self._in_flight[id(self._channel)] = self._in_flight.get(id(self._channel), 0) + 1
      return self._channel, self._stub

  def _release(self, channel: grpc.Channel) -> None:
    with self._lock:
      left = self._in_flight[id(channel)] - 1
      if left:
        self._in_flight[id(channel)] = left
        return
      del self._in_flight[id(channel)]
      retired = self._retired.pop(id(channel), None)
    if retired is not None:
      retired.close()

  def cancel(self) -> None:
    """Stops retrying: from now on a transient failure is raised at once, and a call waiting out its backoff raises
    the last error (a stopping worker must not spend its retry budget on a trainer that is gone)."""
    self._cancelled.set()

  def close(self) -> None:
    """Closes every channel (calls still in flight end with CANCELLED)."""
    with self._lock:
      channels = ([self._channel] if self._channel is not None else []) + list(self._retired.values())
      self._channel, self._stub = None, None
      self._retired.clear()
    for channel in channels:
      channel.close()

  def __enter__(self) -> TrajectoryClient:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _call(self, method: str, request, deadline: float):
    """One RPC, retried with reconnect + backoff on transient errors until `deadline` (then the error is raised)."""
    backoff = self.initial_backoff_s
    while True:
      remaining = deadline - time.monotonic()
      channel, stub = self._acquire()
      try:
        timeout = min(self.rpc_timeout_s, max(self.min_rpc_timeout_s, remaining))
        return getattr(stub, method)(request, timeout=timeout, metadata=self._metadata)
      except grpc.RpcError as e:
        if e.code() not in _TRANSIENT or time.monotonic() + backoff >= deadline or self._cancelled.is_set():
          raise
        logger.info("%s to %s failed (%s: %s); reconnecting in %.2fs", method, self.address, e.code().name,
                    e.details(), backoff)
        if self._cancelled.wait(backoff * self._rng.uniform(0.8, 1.2)):
          raise
        backoff = min(2 * backoff, self.max_backoff_s)
        self._connect(failed=channel)
      finally:
        self._release(channel)

  # ----------------------------------------------------------------------------------------------------------------
  # RPCs.

  def lease(self, n: int) -> sao_pb2.LeaseResponse:
    """Asks for up to `n` tasks. Each `LeasedTask` lists the `sample_indices` to run; `task_json` is the task."""
    return self._call("LeaseTasks", sao_pb2.LeaseRequest(worker_id=self.worker_id, max_tasks=n),
                      time.monotonic() + self.retry_budget_s)

  def heartbeat(self, lease_ids: Sequence[str]) -> sao_pb2.HeartbeatResponse:
    """Extends leases; `expired_lease_ids` in the response are lost (abandon those episodes)."""
    return self._call("Heartbeat", sao_pb2.HeartbeatRequest(worker_id=self.worker_id, lease_ids=list(lease_ids)),
                      time.monotonic() + self.retry_budget_s)

  def status(self) -> sao_pb2.StatusResponse:
    return self._call("GetStatus", sao_pb2.StatusRequest(), time.monotonic() + self.retry_budget_s)

  @property
  def num_pending(self) -> int:
    """Trajectories sent but not yet acknowledged (re-sent by the next `submit`/`flush`)."""
    return len(self._unacked)

  def flush(self) -> list[SubmitOutcome]:
    """Re-sends what is pending; returns outcomes of earlier calls' trajectories resolved now (see `submit`)."""
    self.submit([])
    return self.late_outcomes()

  def late_outcomes(self) -> list[SubmitOutcome]:
    """Outcomes of trajectories from earlier calls that were resolved by a later call (popped)."""
    out, self._late = self._late, []
    return out

  def submit(self, trajs: Sequence[Trajectory], budget_s: float | None = None) -> list[SubmitOutcome]:
    """Submits `trajs` (plus anything still pending) and returns one outcome per element of `trajs`.

    Accepted and permanently rejected trajectories are final; ones pushed back (BACKPRESSURE, INTERNAL) or hit by
    a transport error are re-sent until `budget_s` (default `retry_budget_s`) runs out (an RPC sent before then gets
    at least `min_rpc_timeout_s`), then reported with
    `pending=True` and kept for the next call (an asyncio worker passes a short budget so it is never stuck here).
    Raises `grpc.RpcError` for a non-transient RPC failure (e.g. UNAUTHENTICATED); nothing is dropped then.
    """
    keys = []
    for traj in trajs:
      key = (traj.lease_id, traj.sample_index)
      keys.append(key)
      self._unacked[key] = traj.to_proto()
    wanted = set(keys)
    outcomes: dict[tuple[str, int], SubmitOutcome] = {}
    deadline = time.monotonic() + (self.retry_budget_s if budget_s is None else budget_s)
    while self._unacked and time.monotonic() < deadline:
      batch = list(self._unacked.items())[:self.max_batch]
      try:
        response = self._call("SubmitTrajectories", sao_pb2.SubmitRequest(
            worker_id=self.worker_id, trajectories=[m for _, m in batch]), deadline)
      except grpc.RpcError as e:
        if e.code() in _TRANSIENT:
          logger.warning("submit to %s gave up for now (%s); %d trajectories stay pending", self.address,
                         e.code().name, len(self._unacked))
          break
        raise
      if len(response.results) != len(batch):
        raise RuntimeError(f"server answered {len(response.results)} results for {len(batch)} trajectories")
      wait_ms = 0
      for (key, _), result in zip(batch, response.results):
        reason = ReasonCode(result.reason)
        if not result.accepted and result.retry_after_ms > 0:
          wait_ms = max(wait_ms, result.retry_after_ms)
          continue
        outcome = SubmitOutcome(key[0], key[1], result.accepted, result.accepted and reason == ReasonCode.DUPLICATE,
                                reason, result.message, result.field)
        del self._unacked[key]
        if key in wanted:
          outcomes[key] = outcome
        else:
          self._late.append(outcome)
      if wait_ms:
        time.sleep(max(0.0, min(wait_ms / 1000 * self._rng.uniform(1.0, 1.5), deadline - time.monotonic())))
    return [outcomes.get(k) or SubmitOutcome(k[0], k[1], False, reason=ReasonCode.BACKPRESSURE,
                                             message="not acknowledged within retry_budget_s", pending=True)
            for k in keys]
