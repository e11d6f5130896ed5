"""The durable trajectory log: append-only, fsynced, CRC-checked segment files, plus the learner's consumed ledger.

The trainer-side server appends every accepted trajectory here *before* acknowledging it, so an acknowledged
trajectory survives a trainer crash. On restart, `unconsumed()` returns what was accepted but never consumed by the
learner (the consumed ledger says which keys the learner used, at which step).

On-disk layout of a log directory:
  segment-000000.log, segment-000001.log, ...   records, in append order
  consumed.jsonl                                one JSON line per `ConsumedLedger.mark` call

Record framing (little endian), repeated until the end of a segment:
  magic  4 bytes  b"SAOT"
  length u32      payload bytes
  crc32  u32      zlib.crc32 of the payload
  payload         `Trajectory.to_bytes()` (the `sao.transport.v1.Trajectory` proto)

A crash mid-write leaves a torn last record; a reader detects it by length/CRC, warns naming the segment and the
offset, and skips it (earlier records are kept). A writer never appends after an existing tail: each `TrajectoryLog`
opens a fresh segment, so a torn tail stays the last thing in its own segment.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import re
import struct
import threading
import zlib
from typing import Iterable, Iterator, Sequence

from sao.transport.trajectory import Trajectory, TrajectoryError

_MAGIC = b"SAOT"
_HEADER = struct.Struct("<4sII")
_SEGMENT_RE = re.compile(r"^segment-(\d{6,})\.log$")
LEDGER_NAME = "consumed.jsonl"
# A single record larger than this is certainly a corrupt length field (trajectories are at most a few MB).
_MAX_RECORD_BYTES = 1 << 30

logger = logging.getLogger(__name__)

# Identifies one sample of one lease: submissions are idempotent by this key.
SampleKey = tuple[str, int]


def sample_key(traj: Trajectory) -> SampleKey:
  """The idempotency key of a trajectory: (lease_id, sample_index)."""
  return (traj.lease_id, traj.sample_index)


@dataclasses.dataclass(frozen=True)
class LogRecord:
  """One trajectory read back from the log, with where it lies (`segment` file name, byte `offset`)."""
  segment: str
  offset: int
  trajectory: Trajectory

  @property
  def key(self) -> SampleKey:
    return sample_key(self.trajectory)


def _segment_name(index: int) -> str:
  return f"segment-{index:06d}.log"


def _segments(directory: pathlib.Path) -> list[tuple[int, pathlib.Path]]:
  """Existing segment files, ordered by index."""
  if not directory.is_dir():
    return []
  found = []
  for path in directory.iterdir():
    m = _SEGMENT_RE.match(path.name)
    if m:
      found.append((int(m.group(1)), path))
  return sorted(found)


def _fsync_dir(directory: pathlib.Path) -> None:
  """Makes a newly created file's directory entry durable (an fsynced file is useless if its name is lost)."""
  fd = os.open(directory, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def encode_record(payload: bytes) -> bytes:
  """Frames one payload (header + payload)."""
  return _HEADER.pack(_MAGIC, len(payload), zlib.crc32(payload)) + payload


class TrajectoryLog:
  """Appends trajectories to fsynced segment files in `directory`; thread-safe.

  Args:
    directory: the log directory (created if missing), e.g. `<workdir>/trajectories`.
    segment_bytes: a segment is closed and the next one started before a record would make it exceed this size.
    fsync: False only for throwaway logs (benchmarks); the durability promise needs True.
  """

  def __init__(self, directory: str | os.PathLike, segment_bytes: int = 64 << 20, fsync: bool = True):
    if segment_bytes <= 0:
      raise ValueError(f"segment_bytes must be > 0, got {segment_bytes}")
    self.directory = pathlib.Path(directory)
    self.directory.mkdir(parents=True, exist_ok=True)
    self.segment_bytes = segment_bytes
    self._fsync = fsync
    self._lock = threading.Lock()
    existing = _segments(self.directory)
    self._next_index = existing[-1][0] + 1 if existing else 0
    self._file = None
    self._file_name = ""
    self._file_size = 0

  def _open_next_segment(self) -> None:
    if self._file is not None:
      self._file.close()
    self._file_name = _segment_name(self._next_index)
    self._next_index += 1
    # "xb": never clobber a segment another writer (or an earlier run) made.
    self._file = open(self.directory / self._file_name, "xb")
    self._file_size = 0
    if self._fsync:
      _fsync_dir(self.directory)

  def append(self, traj: Trajectory) -> None:
    """Appends one trajectory; returns only after its bytes are fsynced."""
    self.append_batch([traj])

  def append_batch(self, trajs: Sequence[Trajectory]) -> None:
    """Appends trajectories in order with one fsync per touched segment; returns after they are durable.

    Raises `TrajectoryError` (before writing anything) if a trajectory has no wire encoding, and `OSError` if
    the disk write fails; in the latter case none of the batch should be acknowledged.
    """
    if not trajs:
      return
    frames = [encode_record(t.to_bytes()) for t in trajs]
    with self._lock:
      for frame in frames:
        # Rotate before a record would overflow the limit; a record larger than the limit gets its own segment.
        if self._file is None or (self._file_size and self._file_size + len(frame) > self.segment_bytes):
          if self._file is not None:
            self._sync()
          self._open_next_segment()
        self._file.write(frame)
        self._file_size += len(frame)
      self._sync()

  def _sync(self) -> None:
    self._file.flush()
    if self._fsync:
      os.fsync(self._file.fileno())

  @property
  def current_segment(self) -> str:
    """The name of the segment being written ("" before the first append)."""
    return self._file_name

  def close(self) -> None:
    with self._lock:
      if self._file is not None:
        self._sync()
        self._file.close()
        self._file = None

  def __enter__(self) -> TrajectoryLog:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def _read_segment(path: pathlib.Path) -> Iterator[LogRecord]:
  """Records of one segment; warns about and skips a torn or corrupt record."""
  data = path.read_bytes()
  offset = 0
  while offset < len(data):
    if len(data) - offset < _HEADER.size:
      logger.warning("trajectory log %s: torn record header at offset %d (%d trailing bytes); skipped",
                     path, offset, len(data) - offset)
      return
    magic, length, crc = _HEADER.unpack_from(data, offset)
    if magic != _MAGIC or length > _MAX_RECORD_BYTES:
      # Without a trustworthy header the next record's start is unknown: the rest of the segment is lost.
      logger.warning("trajectory log %s: bad record header at offset %d (magic %r, length %d); skipping the "
                     "remaining %d bytes of this segment", path, offset, magic, length, len(data) - offset)
      return
    start = offset + _HEADER.size
    if start + length > len(data):
      logger.warning("trajectory log %s: torn record at offset %d (length %d, only %d bytes present); skipped",
                     path, offset, length, len(data) - start)
      return
    payload = data[start:start + length]
    if zlib.crc32(payload) != crc:
      # The header was intact, so the next record starts right after this one.
      logger.warning("trajectory log %s: CRC mismatch in record at offset %d (length %d); skipped",
                     path, offset, length)
    else:
      try:
        yield LogRecord(path.name, offset, Trajectory.from_bytes(payload))
      except (TrajectoryError, ValueError) as e:  # protobuf's DecodeError is a ValueError subclass
        logger.warning("trajectory log %s: record at offset %d passed its CRC but does not decode (%s); skipped",
                       path, offset, e)
    offset = start + length


def read_records(directory: str | os.PathLike) -> Iterator[LogRecord]:
  """Every readable record of the log in `directory`, in append order (torn/corrupt records skipped, warned)."""
  for _, path in _segments(pathlib.Path(directory)):
    yield from _read_segment(path)


def read_trajectories(directory: str | os.PathLike) -> Iterator[Trajectory]:
  """`read_records` without the positions: what analysis code wants."""
  for record in read_records(directory):
    yield record.trajectory


class ConsumedLedger:
  """Which sample keys the learner consumed, at which trainer step: append-only, fsynced JSON lines.

  Each line is `{"step": int, "keys": [[lease_id, sample_index], ...]}`. A torn last line (crash mid-write) is
  warned about and ignored, which errs on the side of re-training those samples rather than losing them.
  """

  def __init__(self, directory: str | os.PathLike, fsync: bool = True):
    self.path = pathlib.Path(directory) / LEDGER_NAME
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._fsync = fsync
    self._lock = threading.Lock()
    self._file = None
    self._torn_tail = self._has_torn_tail()

  def _has_torn_tail(self) -> bool:
    """A file not ending in a newline was cut mid-line; the next write must start on a fresh line."""
    if not self.path.exists() or self.path.stat().st_size == 0:
      return False
    with open(self.path, "rb") as f:
      f.seek(-1, os.SEEK_END)
      return f.read(1) != b"\n"

  def mark(self, keys: Iterable[SampleKey], step: int) -> None:
    """Records that the learner consumed `keys` at trainer `step`; returns after fsync."""
    line = json.dumps({"step": int(step), "keys": [[str(k[0]), int(k[1])] for k in keys]}) + "\n"
    with self._lock:
      if self._file is None:
        new = not self.path.exists()
        self._file = open(self.path, "ab")
        if new and self._fsync:
          _fsync_dir(self.path.parent)
      if self._torn_tail:
        line = "\n" + line
        self._torn_tail = False
      self._file.write(line.encode())
      self._file.flush()
      if self._fsync:
        os.fsync(self._file.fileno())

  def close(self) -> None:
    with self._lock:
      if self._file is not None:
        self._file.close()
        self._file = None


def read_consumed(directory: str | os.PathLike) -> dict[SampleKey, int]:
  """Consumed key -> the trainer step that consumed it (the first step, if marked twice)."""
  path = pathlib.Path(directory) / LEDGER_NAME
  consumed: dict[SampleKey, int] = {}
  if not path.exists():
    return consumed
  for lineno, line in enumerate(path.read_text().splitlines(), 1):
    if not line.strip():
      continue
    try:
      entry = json.loads(line)
      step = int(entry["step"])
      keys = [(str(k[0]), int(k[1])) for k in entry["keys"]]
    except (ValueError, KeyError, TypeError, IndexError) as e:
      logger.warning("consumed ledger %s: line %d unreadable (%s); ignored (those samples count as unconsumed)",
                     path, lineno, e)
      continue
    for key in keys:
      consumed.setdefault(key, step)
  return consumed


def unconsumed(directory: str | os.PathLike) -> list[LogRecord]:
  """Accepted-but-unconsumed records, in append order, each key once (a key logged twice keeps its first record)."""
  consumed = read_consumed(directory)
  seen: set[SampleKey] = set()
  out = []
  for record in read_records(directory):
    key = record.key
    if key in consumed or key in seen:
      continue
    seen.add(key)
    out.append(record)
  return out
