"""The durable trajectory log: append-only, fsynced, CRC-checked segment files, plus the learner's consumed ledger.

The trainer-side server appends every accepted trajectory here *before* acknowledging it, so an acknowledged
trajectory survives a trainer crash. On restart, `unconsumed()` returns what was accepted but never consumed by the
learner (the consumed ledger says which keys the learner used, at which step).

On-disk layout of a log directory:
  segment-000000.log, segment-000001.log, ...   records, in append order
  consumed.jsonl                                one JSON line per `ConsumedLedger.mark` call (`ledger`)
  quarantine.jsonl                              records the learner could not use, with why (`ledger`)

Record framing (little endian), repeated until the end of a segment (format 2, written since the header CRC):
  magic       4 bytes  b"SAO2"
  length      u32      payload bytes
  crc32       u32      zlib.crc32 of the payload
  header_crc  u32      zlib.crc32 of the 12 bytes before it (magic, length, crc32)
  payload              `Trajectory.to_bytes()` (the `sao.transport.v1.Trajectory` proto)

Format 1 (b"SAOT", the same without `header_crc`) is still read, so logs written before stay restorable; nothing
writes it any more. A record is trusted only when its header (format 2: its header CRC) and its payload CRC check.
At a record that does not, the reader resynchronises: it scans forward for the next magic that starts a record
passing both checks and resumes there, so a flipped bit anywhere in a record (its length field included) costs
that record, not the rest of its segment. Each skipped span is warned about (segment, offset, bytes) and counted
in an optional `LogReadReport`. A crash mid-write leaves a torn last record: the same path skips it to the end.
A writer never appends after an existing tail: each `TrajectoryLog` opens a fresh segment, so a torn tail stays
the last thing in its own segment.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import re
import struct
import threading
import zlib
from typing import Iterator, Sequence

from sao.transport.ledger import (LEDGER_NAME, QUARANTINE_NAME, ConsumedLedger, QuarantineLedger, SampleKey,
                                  fsync_dir, read_consumed, read_quarantined, sample_key)
from sao.transport.trajectory import Trajectory, TrajectoryError

# The ledgers live in `sao.transport.ledger`; their names stay importable from here, next to the records.
__all__ = ["HEADER_BYTES", "LEDGER_NAME", "QUARANTINE_NAME", "ConsumedLedger", "LogReadReport", "LogRecord",
           "QuarantineLedger", "SampleKey", "TrajectoryLog", "encode_record", "read_consumed", "read_quarantined",
           "read_records", "read_trajectories", "sample_key", "unconsumed"]

_MAGIC = b"SAO2"
_HEADER = struct.Struct("<4sIII")  # magic, payload length, payload CRC, header CRC
_HEADER_CRC_SPAN = 12  # the header CRC covers magic, length and payload CRC
_MAGIC_V1 = b"SAOT"
_HEADER_V1 = struct.Struct("<4sII")  # format 1: no header CRC
HEADER_BYTES = _HEADER.size
_SEGMENT_RE = re.compile(r"^segment-(\d{6,})\.log$")
# A single record larger than this is certainly a corrupt length field (trajectories are at most a few MB).
_MAX_RECORD_BYTES = 1 << 30

logger = logging.getLogger(__name__)

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


def encode_record(payload: bytes) -> bytes:
  """Frames one payload (format-2 header + payload)."""
  head = struct.pack("<4sII", _MAGIC, len(payload), zlib.crc32(payload))
  return head + struct.pack("<I", zlib.crc32(head)) + payload


@dataclasses.dataclass
class LogReadReport:
  """What a read of the log lost: spans of bytes skipped because no valid record started there (a corrupt or torn
  record, a damaged header), and records whose bytes checked but did not decode."""
  records: int = 0
  skipped_spans: int = 0
  skipped_bytes: int = 0
  undecodable: int = 0

  @property
  def lossless(self) -> bool:
    return not (self.skipped_spans or self.undecodable)


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
      fsync_dir(self.directory)

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


def _parse_at(data: bytes, offset: int) -> tuple[int, int] | str:
  """The (payload start, payload end) of a record starting at `offset` whose header and payload check; else why
  not (a short phrase for the warning)."""
  magic = data[offset:offset + 4]
  if magic == _MAGIC:
    header = _HEADER
  elif magic == _MAGIC_V1:
    header = _HEADER_V1
  else:
    return "bad record header (magic)"
  if len(data) - offset < header.size:
    return "torn record header"
  if header is _HEADER:
    _, length, crc, header_crc = _HEADER.unpack_from(data, offset)
    if zlib.crc32(data[offset:offset + _HEADER_CRC_SPAN]) != header_crc:
      return "bad record header (header CRC mismatch)"
  else:
    _, length, crc = _HEADER_V1.unpack_from(data, offset)
  if length > _MAX_RECORD_BYTES:
    return f"bad record header (length {length})"
  start = offset + header.size
  if start + length > len(data):
    return f"torn record (length {length}, only {len(data) - start} bytes present)"
  if zlib.crc32(data[start:start + length]) != crc:
    return "CRC mismatch"
  return start, start + length


def _resync(data: bytes, offset: int) -> int:
  """The first offset >= `offset` where a valid record starts (either format), or len(data)."""
  while True:
    found = [i for i in (data.find(_MAGIC, offset), data.find(_MAGIC_V1, offset)) if i >= 0]
    if not found:
      return len(data)
    candidate = min(found)
    if not isinstance(_parse_at(data, candidate), str):
      return candidate
    offset = candidate + 1


def _read_segment(path: pathlib.Path, report: LogReadReport) -> Iterator[LogRecord]:
  """Records of one segment; a span without a valid record is warned about, counted and skipped (module doc)."""
  data = path.read_bytes()
  offset = 0
  while offset < len(data):
    parsed = _parse_at(data, offset)
    if isinstance(parsed, str):
      resume = _resync(data, offset + 1)
      report.skipped_spans += 1
      report.skipped_bytes += resume - offset
      where = f"resumed at the next valid record, offset {resume}" if resume < len(data) else "to the end of segment"
      logger.warning("trajectory log %s: %s at offset %d; skipped %d bytes (%s)", path, parsed, offset,
                     resume - offset, where)
      offset = resume
      continue
    start, end = parsed
    try:
      trajectory = Trajectory.from_bytes(data[start:end])
    except (TrajectoryError, ValueError) as e:  # protobuf's DecodeError is a ValueError subclass
      report.undecodable += 1
      logger.warning("trajectory log %s: record at offset %d passed its CRC but does not decode (%s); skipped",
                     path, offset, e)
    else:
      report.records += 1
      yield LogRecord(path.name, offset, trajectory)
    offset = end


def read_records(directory: str | os.PathLike, report: LogReadReport | None = None) -> Iterator[LogRecord]:
  """Every readable record of the log in `directory`, in append order (torn/corrupt records skipped, warned, and
  counted in `report` when given)."""
  report = report if report is not None else LogReadReport()
  for _, path in _segments(pathlib.Path(directory)):
    yield from _read_segment(path, report)


def read_trajectories(directory: str | os.PathLike) -> Iterator[Trajectory]:
  """`read_records` without the positions: what analysis code wants."""
  for record in read_records(directory):
    yield record.trajectory


def unconsumed(directory: str | os.PathLike) -> list[LogRecord]:
  """Accepted-but-unconsumed records, in append order, each key once (a key logged twice keeps its first record).
  Quarantined records count as consumed: they are never read back for training."""
  consumed = {**read_consumed(directory), **read_quarantined(directory)}
  seen: set[SampleKey] = set()
  out = []
  for record in read_records(directory):
    key = record.key
    if key in consumed or key in seen:
      continue
    seen.add(key)
    out.append(record)
  return out
