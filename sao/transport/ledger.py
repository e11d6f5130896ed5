"""The learner's side of the trajectory log: which accepted records it consumed, and which it quarantined.

Both are append-only, fsynced JSON-lines files in the log directory (`sao.transport.log`):
  consumed.jsonl    `{"step": int, "keys": [[lease_id, sample_index], ...]}` per `ConsumedLedger.mark`
  quarantine.jsonl  `{"step": int, "key": [lease_id, sample_index], "reason": str, "record": {...}}` per record
                    the learner could not use (`QuarantineLedger.add`); `record` is a field summary, no tokens.
A torn last line (crash mid-write) is warned about and ignored; the next write starts on a fresh line.
"""
from __future__ import annotations

import json
import logging
import os
import pathlib
import threading
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from sao.transport.trajectory import Trajectory

LEDGER_NAME = "consumed.jsonl"
QUARANTINE_NAME = "quarantine.jsonl"

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

# Identifies one sample of one lease: submissions are idempotent by this key.
SampleKey = tuple[str, int]


def sample_key(traj: Trajectory) -> SampleKey:
  """The idempotency key of a trajectory: (lease_id, sample_index)."""
  return (traj.lease_id, traj.sample_index)


def fsync_dir(directory: pathlib.Path) -> None:
  """Makes a newly created file's directory entry durable (an fsynced file is useless if its name is lost)."""
  fd = os.open(directory, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)



class _JsonLines:
  """An append-only, fsynced JSON-lines file that repairs a torn last line before its first write."""

  def __init__(self, path: pathlib.Path, fsync: bool = True):
    self.path = path
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

  def append(self, entries: Sequence[Mapping[str, Any]]) -> None:
    """Appends one line per entry; returns after fsync."""
    text = "".join(json.dumps(e) + "\n" for e in entries)
    with self._lock:
      if self._file is None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        self._file = open(self.path, "ab")
        if new and self._fsync:
          fsync_dir(self.path.parent)
      if self._torn_tail:
        text = "\n" + text
        self._torn_tail = False
      self._file.write(text.encode())
      self._file.flush()
      if self._fsync:
        os.fsync(self._file.fileno())

  def close(self) -> None:
    with self._lock:
      if self._file is not None:
        self._file.close()
        self._file = None


def _read_entries(path: pathlib.Path, parse: Callable[[Any], _T], ledger: str, ignored: str) -> Iterator[_T]:
  """`parse(entry)` of each non-blank JSON line of `path`, in order (nothing if there is no file). A line that is not
  JSON, or whose entry `parse` cannot read (ValueError, KeyError, TypeError, IndexError: a torn last line, a
  hand-edited one), is logged as "<ledger> ledger <path>: line <n> unreadable (<error>); <ignored>" and skipped."""
  if not path.exists():
    return
  for lineno, line in enumerate(path.read_text().splitlines(), 1):
    if not line.strip():
      continue
    try:
      parsed = parse(json.loads(line))
    except (ValueError, KeyError, TypeError, IndexError) as e:
      logger.warning("%s ledger %s: line %d unreadable (%s); %s", ledger, path, lineno, e, ignored)
      continue
    yield parsed


class ConsumedLedger:
  """Which sample keys the learner consumed, at which trainer step (`consumed.jsonl`, module docstring). A torn
  last line is ignored on reading, which errs on the side of re-training those samples rather than losing them."""

  def __init__(self, directory: str | os.PathLike, fsync: bool = True):
    self.path = pathlib.Path(directory) / LEDGER_NAME
    self._lines = _JsonLines(self.path, fsync)

  def mark(self, keys: Iterable[SampleKey], step: int) -> None:
    """Records that the learner consumed `keys` at trainer `step`; returns after fsync."""
    self._lines.append([{"step": int(step), "keys": [[str(k[0]), int(k[1])] for k in keys]}])

  def close(self) -> None:
    self._lines.close()


class QuarantineLedger:
  """Records the learner could not use, each with its reason (`quarantine.jsonl`, module docstring)."""

  def __init__(self, directory: str | os.PathLike, fsync: bool = True):
    self.path = pathlib.Path(directory) / QUARANTINE_NAME
    self._lines = _JsonLines(self.path, fsync)

  def add(self, entries: Sequence[tuple[SampleKey, str, Mapping[str, Any]]], step: int) -> None:
    """Records `(key, reason, record summary)` entries found at trainer `step`; returns after fsync."""
    self._lines.append([{"step": int(step), "key": [str(k[0]), int(k[1])], "reason": str(reason),
                         "record": dict(summary)} for k, reason, summary in entries])

  def close(self) -> None:
    self._lines.close()


def _consumed_entry(entry: Any) -> tuple[int, list[SampleKey]]:
  return int(entry["step"]), [(str(k[0]), int(k[1])) for k in entry["keys"]]


def _quarantine_entry(entry: Any) -> tuple[SampleKey, str]:
  return (str(entry["key"][0]), int(entry["key"][1])), str(entry["reason"])


def read_consumed(directory: str | os.PathLike) -> dict[SampleKey, int]:
  """Consumed key -> the trainer step that consumed it (the first step, if marked twice)."""
  consumed: dict[SampleKey, int] = {}
  for step, keys in _read_entries(pathlib.Path(directory) / LEDGER_NAME, _consumed_entry, "consumed",
                                  "ignored (those samples count as unconsumed)"):
    for key in keys:
      consumed.setdefault(key, step)
  return consumed


def read_quarantined(directory: str | os.PathLike) -> dict[SampleKey, str]:
  """Quarantined key -> the reason it was quarantined (the first, if quarantined twice)."""
  out: dict[SampleKey, str] = {}
  for key, reason in _read_entries(pathlib.Path(directory) / QUARANTINE_NAME, _quarantine_entry, "quarantine",
                                   "ignored"):
    out.setdefault(key, reason)
  return out
