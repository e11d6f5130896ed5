"""Process 0 decides, every process follows: the trainer job's control channel, and the watchdog that stops the job
when a process is lost.

In a trainer job of P processes (one per host) every process runs the learner, and every process must issue the
same jitted calls in the same order. Anything that steers the program — the next batch's trajectories, a phase
change, whether the base policy or a checkpoint exists, when to stop — is decided once, on process 0, and `share`d:

    process 0:  msg = channel.share("step", {"step": 7, ...}, trajectories)   # sends, returns what it sent
    process i:  msg = channel.share("step")                                    # blocks for the next message

Messages are delivered to every process in the order process 0 sent them; a process that asks for tag "step" while
the next message is a "stop" raises `Diverged` (the two programs are not at the same point). Trajectories travel as
their protobuf bytes (`Trajectory.to_bytes`), the rest as JSON.

Transport: the JAX coordination service's key-value store (the `jax.distributed` client every process already has;
process 0 hosts the service). Message n is stored in pieces of at most `CHUNK_BYTES` (`<ns>/msg/<n>.<k>`, then the
key `<ns>/msg/<n>` holding the number of pieces, which the others wait for); each process acknowledges the last
message it read (`<ns>/ack/<i>`), and process 0 deletes messages every process has read. A batch is ~8 bytes per
token (`Trajectory.to_bytes`: int32 id, float32 log-prob, a mask byte), and every process reads all of it: the
toy's 64 × ≤192 tokens are ≤100 KB a step; `sao_openswe.py:full`'s 64 trajectories of ≤128k tokens ≤66 MB, read by
each of the other P−1 hosts — seconds at most, against a learner step over 8M tokens (docs/tpu.md).

Liveness: a watchdog thread in every process bumps its own heartbeat key every `heartbeat_interval_s` and reads
everyone's. A process whose heartbeat has not changed for `heartbeat_timeout_s` (killed, frozen, its host gone), or
that reported its own failure (`report_failure`), is lost: the next `share`/`check` raises `ProcessLost` naming it,
and if the main thread is stuck inside a collective and does not get there within `exit_grace_s`, the watchdog
prints the same message and ends the process with exit code `EXIT_PROCESS_LOST`. The coordination service's own
heartbeat timeout (`jax.distributed.initialize(heartbeat_timeout_seconds=...)`) should be longer, so that this
message, not the service's abort, is what a lost process produces.

With one process, `LocalChannel`: `share` returns its arguments, nothing else happens (the single-process trainer
behaves as before).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import struct
import sys
import threading
import time
from typing import Any, Sequence

from absl import logging

from sao.transport.trajectory import Trajectory

EXIT_PROCESS_LOST = 3
CHUNK_BYTES = 32 << 20  # one key-value entry (gRPC messages to the coordination service stay far below 2 GB)
_LENGTH = struct.Struct("<Q")


class ProcessLost(RuntimeError):
  """A process of the job died, hung or failed; the message names it."""

  def __init__(self, process_id: int, reason: str):
    super().__init__(f"process {process_id} of the trainer job is lost: {reason}")
    self.process_id = process_id


class Diverged(RuntimeError):
  """This process's program is not where process 0's is (a message of another kind came than the one asked for), or
  the processes' plans for the same update differ (`agree`)."""


class Stalled(ProcessLost):
  """No progress: a process has been inside one collective phase (an update, an export, a checkpoint) longer than
  its bound (`KeyValueChannel`'s progress watchdog); the message names every process's phase."""


def check_plans(tag: str, plans: Sequence[Any]) -> None:
  """Raises `Diverged` unless every process's plan for `tag` equals process 0's, naming both plans and the keys
  that differ."""
  for i, plan in enumerate(plans[1:], 1):
    if plan != plans[0]:
      keys = sorted(k for k in set(plans[0]) | set(plan) if plans[0].get(k) != plan.get(k)) if (
          isinstance(plan, dict) and isinstance(plans[0], dict)) else []
      raise Diverged(f"the processes disagree about the plan of {tag!r} (differing: {', '.join(keys) or 'all'}): "
                     f"process 0 plans {json.dumps(plans[0], sort_keys=True)[:1500]} but process {i} plans "
                     f"{json.dumps(plan, sort_keys=True)[:1500]}")


def combine_flags(flags: Sequence[dict[str, bool]]) -> dict[str, bool]:
  """Every flag set by any process."""
  out: dict[str, bool] = {}
  for f in flags:
    for k, v in f.items():
      out[k] = out.get(k, False) or bool(v)
  return out


@dataclasses.dataclass
class Message:
  tag: str
  data: Any = None  # JSON-serialisable
  trajectories: list[Trajectory] = dataclasses.field(default_factory=list)


def encode(message: Message) -> bytes:
  """`[len][json header][len][trajectory]...`: the header holds the tag, the data and the trajectory count."""
  header = json.dumps({"tag": message.tag, "data": message.data, "n": len(message.trajectories)}).encode()
  parts = [_LENGTH.pack(len(header)), header]
  for t in message.trajectories:
    raw = t.to_bytes()
    parts += [_LENGTH.pack(len(raw)), raw]
  return b"".join(parts)


def decode(raw: bytes) -> Message:
  def chunk(offset: int) -> tuple[bytes, int]:
    (n,) = _LENGTH.unpack_from(raw, offset)
    start = offset + _LENGTH.size
    if start + n > len(raw):
      raise ValueError(f"coordination message truncated: a part of {n} bytes at offset {start} of {len(raw)}")
    return raw[start:start + n], start + n
  header_bytes, offset = chunk(0)
  header = json.loads(header_bytes)
  trajectories = []
  for _ in range(header["n"]):
    body, offset = chunk(offset)
    trajectories.append(Trajectory.from_bytes(body))
  return Message(header["tag"], header["data"], trajectories)


class LocalChannel:
  """The one-process job: this process decides and follows itself."""
  process_id, num_processes, is_coordinator = 0, 1, True

  def share(self, tag: str, data: Any = None, trajectories: Sequence[Trajectory] = ()) -> Message:
    return Message(tag, data, list(trajectories))

  def agree(self, tag: str, plan: Any, flags: dict[str, bool] | None = None) -> dict[str, bool]:
    del tag, plan
    return dict(flags or {})

  def busy(self, phase: str) -> "contextlib.AbstractContextManager":
    del phase
    return contextlib.nullcontext()

  def phase(self) -> str:
    return ""

  def check(self) -> None:
    pass

  def report_failure(self, reason: str) -> None:
    del reason

  def explain(self, error: BaseException) -> BaseException:
    return error

  def close(self) -> None:
    pass


class KeyValueChannel:
  """The P-process job's channel over the coordination service's key-value store (module docstring).

  Args:
    client: the `jax.distributed` client (`key_value_set`, `blocking_key_value_get_bytes`, `key_value_dir_get`...).
    process_id, num_processes: this process and the job's size.
    heartbeat_timeout_s: a process silent this long is lost.
    heartbeat_interval_s: how often the watchdog beats and looks.
    exit_grace_s: after a loss, how long the main thread has to stop by itself before the watchdog ends the process.
    namespace: the keys' prefix.
    stall_compile_budget_s, stall_step_factor: the progress watchdog's bound on one `busy` phase, `compile budget +
      factor × the longest phase this process has finished` (the first phases of each shape compile). A process
      longer than its bound in one phase stalls the job: every process exits naming each one's phase (`Stalled`).
  """

  def __init__(self, client: Any, process_id: int, num_processes: int, heartbeat_timeout_s: float = 30.0,
               heartbeat_interval_s: float = 1.0, exit_grace_s: float = 15.0, namespace: str = "sao/coordination",
               stall_compile_budget_s: float = 1800.0, stall_step_factor: float = 5.0):
    if not 0 <= process_id < num_processes:
      raise ValueError(f"coordination: process_id {process_id} is outside [0, {num_processes})")
    if heartbeat_timeout_s <= 2 * heartbeat_interval_s:
      raise ValueError(f"coordination: heartbeat_timeout_s ({heartbeat_timeout_s}) must exceed two heartbeat "
                       f"intervals ({heartbeat_interval_s})")
    self.client = client
    self.process_id, self.num_processes = process_id, num_processes
    self.is_coordinator = process_id == 0
    self.heartbeat_timeout_s, self.heartbeat_interval_s = heartbeat_timeout_s, heartbeat_interval_s
    self.exit_grace_s = exit_grace_s
    self.ns = namespace
    self._sent = 0  # process 0: messages sent; others: messages read
    self._deleted = 0  # process 0: messages below this are deleted
    self._lost: ProcessLost | None = None
    self._exchanged = 0  # `agree` rounds so far
    self.stall_compile_budget_s, self.stall_step_factor = stall_compile_budget_s, stall_step_factor
    self._phase, self._busy_since, self._longest_s = "starting", None, 0.0
    self._stop = threading.Event()
    self._watchdog = threading.Thread(target=self._watch, name="coordination-watchdog", daemon=True)
    self._beat(0)
    self._watchdog.start()

  # ------------------------------------------------------------------------------------------------ messages
  def share(self, tag: str, data: Any = None, trajectories: Sequence[Trajectory] = ()) -> Message:
    """Process 0: sends (tag, data, trajectories) to every other process and returns it. Others: the next message,
    which must carry `tag` (else `Diverged`). Raises `ProcessLost` once a process is lost."""
    self.check()
    if self.is_coordinator:
      message = Message(tag, data, list(trajectories))
      raw = encode(message)
      pieces = [raw[i:i + CHUNK_BYTES] for i in range(0, len(raw), CHUNK_BYTES)] or [b""]
      for k, piece in enumerate(pieces):
        self.client.key_value_set_bytes(f"{self._msg_key(self._sent)}.{k}", piece)
      self.client.key_value_set_bytes(self._msg_key(self._sent), str(len(pieces)).encode())  # last: it is complete
      self._sent += 1
      self._delete_read()
      return message
    key = self._msg_key(self._sent)
    num_pieces = int(self._wait_for(key))
    raw = b"".join(self._wait_for(f"{key}.{k}") for k in range(num_pieces))
    self._sent += 1
    self.client.key_value_set(f"{self.ns}/ack/{self.process_id}", str(self._sent), allow_overwrite=True)
    message = decode(raw)
    if message.tag != tag:
      raise Diverged(f"process {self.process_id} expected a {tag!r} message from process 0 but the next one (number "
                     f"{self._sent - 1}) is {message.tag!r} (data {str(message.data)[:200]})")
    return message

  # ------------------------------------------------------------------------------------------------ agreement
  def agree(self, tag: str, plan: Any, flags: dict[str, bool] | None = None) -> dict[str, bool]:
    """Every process publishes its `plan` for `tag` (JSON) and its `flags`, then reads every other's: plans that
    differ raise `Diverged` naming both (`check_plans`) before anything runs; returns the flags any process set (a
    stop one process was asked for becomes every process's). All processes call it the same number of times."""
    n = self._exchanged
    self._exchanged += 1
    key = f"{self.ns}/agree/{n:012d}"
    mine = {"tag": tag, "plan": plan, "flags": dict(flags or {})}
    self.client.key_value_set_bytes(f"{key}/{self.process_id}", json.dumps(mine).encode())
    entries = [mine if i == self.process_id else json.loads(self._wait_for(f"{key}/{i}"))
               for i in range(self.num_processes)]
    if n >= 2:  # every process finished round n − 2 before it wrote round n − 1, which this one has read
      self.client.key_value_delete(f"{self.ns}/agree/{n - 2:012d}/{self.process_id}")
    tags = [e["tag"] for e in entries]
    if len(set(tags)) > 1:
      raise Diverged(f"agreement round {n}: the processes are at different points: {tags} (process i's tag at i)")
    check_plans(tag, [e["plan"] for e in entries])
    return combine_flags([e["flags"] for e in entries])

  # ------------------------------------------------------------------------------------------------ progress
  @contextlib.contextmanager
  def busy(self, phase: str):
    """Marks this process as inside the collective phase `phase` (an update, an export, a checkpoint) for the
    progress watchdog, which the heartbeat carries to every process."""
    self._phase, self._busy_since = phase, time.monotonic()
    try:
      yield
    finally:
      self._longest_s = max(self._longest_s, time.monotonic() - self._busy_since)
      self._phase, self._busy_since = f"between phases (after {phase})", None

  def phase(self) -> str:
    """What this process is doing, as the watchdog reports it."""
    return self._phase

  def _progress(self, now: float) -> dict[str, Any]:
    busy_s = 0.0 if self._busy_since is None else now - self._busy_since
    return {"phase": self._phase, "busy_s": round(busy_s, 1),
            "bound_s": round(self.stall_compile_budget_s + self.stall_step_factor * self._longest_s, 1)}

  def _wait_for(self, key: str) -> bytes:
    """The value of `key` once process 0 has set it; `ProcessLost` if a process is lost meanwhile."""
    while True:
      try:
        return self.client.blocking_key_value_get_bytes(key, int(self.heartbeat_interval_s * 1000))
      except Exception as e:  # noqa: BLE001 — the client raises one error type; a deadline means "not yet"
        if "DEADLINE_EXCEEDED" not in str(e):
          raise self.explain(e) from e
        self.check()

  def _msg_key(self, n: int) -> str:
    return f"{self.ns}/msg/{n:012d}"

  def _delete_read(self) -> None:
    """Deletes the messages every other process has acknowledged."""
    acks = dict(self.client.key_value_dir_get(f"{self.ns}/ack/"))
    read = min((int(acks.get(f"{self.ns}/ack/{i}", 0)) for i in range(1, self.num_processes)), default=self._sent)
    while self._deleted < read:
      key = self._msg_key(self._deleted)
      num_pieces = int(self.client.blocking_key_value_get_bytes(key, 10_000))
      for k in range(num_pieces):
        self.client.key_value_delete(f"{key}.{k}")
      self.client.key_value_delete(key)
      self._deleted += 1

  # ------------------------------------------------------------------------------------------------ failures
  def check(self) -> None:
    """Raises `ProcessLost` if the watchdog found a lost process."""
    if self._lost is not None:
      raise self._lost

  def report_failure(self, reason: str) -> None:
    """Tells the other processes that this one is stopping on an error (they raise `ProcessLost` with `reason`)."""
    try:
      self.client.key_value_set(f"{self.ns}/failed/{self.process_id}", reason[-2000:], allow_overwrite=True)
    except Exception as e:  # noqa: BLE001 — the service may be gone with process 0; the heartbeat still stops
      logging.warning("coordination: could not report this process's failure: %s", e)

  def explain(self, error: BaseException, wait_s: float | None = None) -> BaseException:
    """The `ProcessLost` behind `error` (say a collective that failed because a peer died), waiting up to a
    heartbeat timeout for the watchdog's verdict; `error` itself when no process is lost."""
    if isinstance(error, (ProcessLost, Diverged)):
      return error
    deadline = time.monotonic() + (self.heartbeat_timeout_s + 2 * self.heartbeat_interval_s
                                   if wait_s is None else wait_s)
    while self._lost is None and time.monotonic() < deadline:
      time.sleep(min(self.heartbeat_interval_s, 0.2))
    return self._lost if self._lost is not None else error

  def close(self) -> None:
    self._stop.set()
    self._watchdog.join(timeout=5 * self.heartbeat_interval_s)

  # ------------------------------------------------------------------------------------------------ the watchdog
  def _beat(self, n: int) -> None:
    """The heartbeat: a counter (liveness) and this process's progress (the stall check)."""
    beat = json.dumps({"n": n, **self._progress(time.monotonic())})
    self.client.key_value_set(f"{self.ns}/heartbeat/{self.process_id}", beat, allow_overwrite=True)

  def _stall(self, beats: dict[str, str]) -> Stalled | None:
    """`Stalled` when a process (this one included) has been in one phase longer than its bound, naming every
    process's phase; else None."""
    progress = {}
    for i in range(self.num_processes):
      try:
        progress[i] = json.loads(beats.get(f"{self.ns}/heartbeat/{i}") or "{}")
      except ValueError:
        progress[i] = {}
    stalled = [i for i, p in progress.items() if p.get("busy_s", 0.0) > p.get("bound_s", float("inf"))]
    if not stalled:
      return None
    phases = "; ".join(f"process {i}: {p.get('phase', '?')} for {p.get('busy_s', 0.0):.0f} s (bound "
                       f"{p.get('bound_s', float('nan')):.0f} s)" for i, p in sorted(progress.items()))
    return Stalled(stalled[0], f"no progress: the job is stuck (a collective no other process joined?). {phases}. "
                               "The bound is distributed.stall_compile_budget_s + distributed.stall_step_factor × "
                               "the longest phase so far")

  def _watch(self) -> None:
    peers = [i for i in range(self.num_processes) if i != self.process_id]
    last_value: dict[int, str | None] = {i: None for i in peers}
    now = time.monotonic()
    last_change = {i: now for i in peers}
    unreachable_since = None
    n = 0
    while not self._stop.wait(self.heartbeat_interval_s):
      n += 1
      now = time.monotonic()
      try:
        self._beat(n)
        beats = dict(self.client.key_value_dir_get(f"{self.ns}/heartbeat/"))
        failed = dict(self.client.key_value_dir_get(f"{self.ns}/failed/"))
        unreachable_since = None
      except Exception as e:  # noqa: BLE001 — the service lives in process 0: unreachable means it is gone
        unreachable_since = unreachable_since or now
        if now - unreachable_since > self.heartbeat_timeout_s:
          self._declare(ProcessLost(0, f"the coordination service (in process 0) has been unreachable for "
                                       f"{now - unreachable_since:.0f} s: {e}"))
          return
        continue
      stalled = self._stall(beats)
      if stalled is not None:
        self._declare(stalled)
        return
      for i in peers:
        reason = failed.get(f"{self.ns}/failed/{i}")
        if reason is not None:
          self._declare(ProcessLost(i, f"it stopped with an error: {reason}"))
          return
        value = beats.get(f"{self.ns}/heartbeat/{i}")
        if value != last_value[i]:
          last_value[i], last_change[i] = value, now
        elif now - last_change[i] > self.heartbeat_timeout_s:
          self._declare(ProcessLost(i, f"no heartbeat for {now - last_change[i]:.0f} s (heartbeat_timeout_s "
                                       f"{self.heartbeat_timeout_s:g}): it died, hung or its host is gone"))
          return

  def _declare(self, lost: ProcessLost) -> None:
    """Records the loss for the main thread; ends the process if the main thread has not within `exit_grace_s`."""
    self._lost = lost
    print(f"[coordination] process {self.process_id}: {lost}", file=sys.stderr, flush=True)
    if self._stop.wait(self.exit_grace_s):
      return  # closed: the main thread is stopping by itself
    print(f"[coordination] process {self.process_id}: {lost}; the main thread did not stop within "
          f"{self.exit_grace_s:g} s (blocked in a collective?): exiting with code {EXIT_PROCESS_LOST}",
          file=sys.stderr, flush=True)
    os._exit(EXIT_PROCESS_LOST)  # pylint: disable=protected-access


def create(heartbeat_timeout_s: float = 30.0, heartbeat_interval_s: float = 1.0, exit_grace_s: float = 15.0,
           stall_compile_budget_s: float = 1800.0, stall_step_factor: float = 5.0) -> LocalChannel | KeyValueChannel:
  """The channel for this process: `LocalChannel` with one JAX process, else a `KeyValueChannel` on the
  `jax.distributed` client (`sao.train.distributed.initialize` must have run)."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() == 1:
    return LocalChannel()
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
  client = jax_distributed.global_state.client
  if client is None:
    raise RuntimeError(f"coordination: {jax.process_count()} JAX processes but no jax.distributed client")
  return KeyValueChannel(client, jax.process_index(), jax.process_count(), heartbeat_timeout_s,
                         heartbeat_interval_s, exit_grace_s, stall_compile_budget_s=stall_compile_budget_s,
                         stall_step_factor=stall_step_factor)
