"""Tests for the durable trajectory log: round trip, torn tail, corrupt CRC, resync after a damaged header,
format-1 segments, rotation, the consumed ledger."""
import logging
import os
import struct
import zlib

import numpy as np
import pytest

from sao.transport import log as log_lib
from sao.transport.trajectory import Trajectory


def make(i: int, lease: str = "lease", n_tokens: int = 8) -> Trajectory:
  """A valid trajectory whose content depends on `i` (so records are distinguishable)."""
  mask = np.zeros(n_tokens, bool)
  mask[n_tokens // 2:] = True
  return Trajectory(task_id=f"t{i}", token_ids=np.arange(n_tokens) + i, action_mask=mask,
                    rollout_logprobs=np.where(mask, -0.5, 0.0), reward=float(i), policy_version=1,
                    lease_id=f"{lease}{i}", sample_index=0, metadata={"i": str(i)})


def segment_paths(directory):
  return sorted(p for p in directory.iterdir() if p.name.startswith("segment-"))


def test_round_trip_in_order(tmp_path):
  trajs = [make(i) for i in range(5)]
  with log_lib.TrajectoryLog(tmp_path) as log:
    log.append(trajs[0])
    log.append_batch(trajs[1:])
  records = list(log_lib.read_records(tmp_path))
  assert [r.trajectory for r in records] == trajs
  assert records[0].segment == "segment-000000.log" and records[0].offset == 0
  assert list(log_lib.read_trajectories(tmp_path)) == trajs


def test_reopening_starts_a_new_segment_and_keeps_old_records(tmp_path):
  with log_lib.TrajectoryLog(tmp_path) as log:
    log.append(make(0))
  with log_lib.TrajectoryLog(tmp_path) as log:
    log.append(make(1))
    assert log.current_segment == "segment-000001.log"
  assert [t.task_id for t in log_lib.read_trajectories(tmp_path)] == ["t0", "t1"]


def test_torn_tail_is_warned_and_skipped(tmp_path, caplog):
  with log_lib.TrajectoryLog(tmp_path) as log:
    log.append_batch([make(i) for i in range(3)])
  (path,) = segment_paths(tmp_path)
  records = list(log_lib.read_records(tmp_path))
  last_offset = records[-1].offset
  with open(path, "r+b") as f:  # crash mid-write: the last record loses its final bytes
    f.truncate(os.path.getsize(path) - 5)
  with caplog.at_level(logging.WARNING, logger=log_lib.__name__):
    kept = list(log_lib.read_records(tmp_path))
  assert [r.trajectory.task_id for r in kept] == ["t0", "t1"]
  assert "torn record" in caplog.text and path.name in caplog.text and f"offset {last_offset}" in caplog.text


def test_torn_header_is_warned_and_skipped(tmp_path, caplog):
  with log_lib.TrajectoryLog(tmp_path) as log:
    log.append_batch([make(0), make(1)])
  (path,) = segment_paths(tmp_path)
  second = list(log_lib.read_records(tmp_path))[1].offset
  with open(path, "r+b") as f:
    f.truncate(second + 6)  # only part of the 16-byte header made it
  with caplog.at_level(logging.WARNING, logger=log_lib.__name__):
    kept = list(log_lib.read_records(tmp_path))
  assert [r.trajectory.task_id for r in kept] == ["t0"]
  assert "torn record header" in caplog.text and f"offset {second}" in caplog.text


def test_corrupt_crc_skips_only_that_record(tmp_path, caplog):
  with log_lib.TrajectoryLog(tmp_path) as log:
    log.append_batch([make(i) for i in range(3)])
  (path,) = segment_paths(tmp_path)
  middle = list(log_lib.read_records(tmp_path))[1].offset
  data = bytearray(path.read_bytes())
  data[middle + log_lib.HEADER_BYTES + 3] ^= 0xFF  # flip a payload byte of the middle record
  path.write_bytes(bytes(data))
  with caplog.at_level(logging.WARNING, logger=log_lib.__name__):
    kept = list(log_lib.read_records(tmp_path))
  assert [r.trajectory.task_id for r in kept] == ["t0", "t2"]
  assert "CRC mismatch" in caplog.text and f"offset {middle}" in caplog.text


def test_bad_magic_costs_only_that_record(tmp_path, caplog):
  with log_lib.TrajectoryLog(tmp_path) as log:
    log.append_batch([make(0), make(1)])
  with log_lib.TrajectoryLog(tmp_path) as log:
    log.append(make(2))
  first = segment_paths(tmp_path)[0]
  second_offset = list(log_lib.read_records(tmp_path))[1].offset
  data = bytearray(first.read_bytes())
  data[second_offset:second_offset + 4] = b"XXXX"
  first.write_bytes(bytes(data))
  with caplog.at_level(logging.WARNING, logger=log_lib.__name__):
    kept = list(log_lib.read_records(tmp_path))
  assert [r.trajectory.task_id for r in kept] == ["t0", "t2"]
  assert "bad record header" in caplog.text


def test_rotation_at_size_limit(tmp_path):
  record_size = max(len(log_lib.encode_record(make(i).to_bytes())) for i in range(6))
  with log_lib.TrajectoryLog(tmp_path, segment_bytes=2 * record_size + 4) as log:
    log.append_batch([make(i) for i in range(5)])
    log.append(make(5))
  paths = segment_paths(tmp_path)
  assert [p.name for p in paths] == [f"segment-00000{i}.log" for i in range(3)]
  assert all(p.stat().st_size <= 2 * record_size + 4 for p in paths)
  assert [t.task_id for t in log_lib.read_trajectories(tmp_path)] == [f"t{i}" for i in range(6)]


def test_consumed_ledger_gives_unconsumed_set(tmp_path):
  with log_lib.TrajectoryLog(tmp_path) as log:
    log.append_batch([make(i) for i in range(5)])
    log.append(make(1))  # the same key logged twice counts once
  ledger = log_lib.ConsumedLedger(tmp_path)
  ledger.mark([("lease0", 0), ("lease2", 0)], step=7)
  ledger.mark([("lease3", 0)], step=8)
  ledger.close()
  assert log_lib.read_consumed(tmp_path) == {("lease0", 0): 7, ("lease2", 0): 7, ("lease3", 0): 8}
  assert [r.key for r in log_lib.unconsumed(tmp_path)] == [("lease1", 0), ("lease4", 0)]


def test_consumed_ledger_torn_line_is_ignored_and_next_mark_starts_fresh(tmp_path, caplog):
  ledger = log_lib.ConsumedLedger(tmp_path)
  ledger.mark([("a", 0)], step=1)
  ledger.close()
  with open(tmp_path / log_lib.LEDGER_NAME, "a") as f:
    f.write('{"step": 2, "keys": [["b", 0')  # crash mid-line
  ledger = log_lib.ConsumedLedger(tmp_path)
  ledger.mark([("c", 0)], step=3)
  ledger.close()
  with caplog.at_level(logging.WARNING, logger=log_lib.__name__):
    consumed = log_lib.read_consumed(tmp_path)
  assert consumed == {("a", 0): 1, ("c", 0): 3}
  assert "line 2 unreadable" in caplog.text
  assert "consumed ledger" in caplog.text and "those samples count as unconsumed" in caplog.text


def test_quarantine_ledger_reads_the_first_reason_and_skips_unreadable_lines(tmp_path, caplog):
  ledger = log_lib.QuarantineLedger(tmp_path)
  ledger.add([(("a", 0), "nan reward", {"reward": "nan"})], step=1)
  ledger.close()
  with open(tmp_path / log_lib.QUARANTINE_NAME, "a") as f:
    f.write('{"step": 2, "key": ["b", 0]}\n\n')  # no reason (a hand-edited line), then a blank line
    f.write('{"step": 3, "key": ["c", 0], "reason": "too lo')  # crash mid-line
  ledger = log_lib.QuarantineLedger(tmp_path)
  ledger.add([(("a", 0), "later reason", {}), (("d", 1), "empty actions", {})], step=4)
  ledger.close()
  with caplog.at_level(logging.WARNING):
    quarantined = log_lib.read_quarantined(tmp_path)
  assert quarantined == {("a", 0): "nan reward", ("d", 1): "empty actions"}
  assert "quarantine ledger" in caplog.text
  assert "line 2 unreadable" in caplog.text and "line 4 unreadable" in caplog.text
  assert log_lib.read_quarantined(tmp_path / "missing") == {}


def test_invalid_segment_size_is_refused(tmp_path):
  with pytest.raises(ValueError, match="segment_bytes"):
    log_lib.TrajectoryLog(tmp_path, segment_bytes=0)


def _segment_of_ten(tmp_path):
  with log_lib.TrajectoryLog(tmp_path / "clean") as log:
    log.append_batch([make(i) for i in range(10)])
  (path,) = segment_paths(tmp_path / "clean")
  offsets = [r.offset for r in log_lib.read_records(tmp_path / "clean")] + [path.stat().st_size]
  return path.read_bytes(), offsets


@pytest.mark.parametrize("field,start,stop", [("magic", 0, 4), ("length", 4, 8), ("payload crc", 8, 12),
                                              ("header crc", 12, 16), ("payload", 16, 40)])
def test_a_flipped_bit_in_any_header_field_costs_one_record_and_is_reported(tmp_path, caplog, field, start, stop):
  clean, offsets = _segment_of_ten(tmp_path)
  middle = offsets[4]
  for byte in range(start, stop):
    for bit in (0, 3, 7):
      data = bytearray(clean)
      data[middle + byte] ^= 1 << bit
      directory = tmp_path / f"flip{byte}_{bit}"
      directory.mkdir()
      (directory / "segment-000000.log").write_bytes(bytes(data))
      report = log_lib.LogReadReport()
      caplog.clear()
      with caplog.at_level(logging.WARNING, logger=log_lib.__name__):
        kept = [r.trajectory.task_id for r in log_lib.read_records(directory, report)]
      assert kept == [f"t{i}" for i in range(10) if i != 4], (field, byte, bit)
      assert (report.records, report.skipped_spans, report.undecodable) == (9, 1, 0), (field, byte, bit)
      assert report.skipped_bytes == offsets[5] - middle and not report.lossless
      assert f"offset {middle}" in caplog.text and f"skipped {offsets[5] - middle} bytes" in caplog.text


def test_format_1_segments_stay_readable_and_resync_too(tmp_path, caplog):
  def v1(traj):  # the framing written before the header CRC
    payload = traj.to_bytes()
    return struct.pack("<4sII", b"SAOT", len(payload), zlib.crc32(payload)) + payload

  frames = [v1(make(i)) for i in range(5)]
  data = bytearray(b"".join(frames))
  data[len(frames[0]) + len(frames[1]) + 7] ^= 0x80  # the length field of record 2: 2^31 more bytes
  (tmp_path / "segment-000000.log").write_bytes(bytes(data))
  with log_lib.TrajectoryLog(tmp_path) as log:  # a new writer after an upgrade: format 2 in the next segment
    log.append(make(5))
  report = log_lib.LogReadReport()
  with caplog.at_level(logging.WARNING, logger=log_lib.__name__):
    kept = [r.trajectory.task_id for r in log_lib.read_records(tmp_path, report)]
  assert kept == ["t0", "t1", "t3", "t4", "t5"]
  assert (report.skipped_spans, report.skipped_bytes) == (1, len(frames[2]))
