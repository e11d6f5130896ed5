"""Restart from the log, alone: records the trainer cannot take are quarantined once and never buffered again;
what reading the log lost is reported in the server's counters."""
import pytest

from sao.transport import log as log_lib
from sao.transport.dispenser import DispenserConfig, TaskDispenser
from sao.transport.server import ServerConfig, TrajectoryServer
from sao.transport.trajectory import Trajectory

from tests.transport.helpers import VOCAB


def _traj(i: int, **overrides) -> Trajectory:
  kwargs = dict(task_id=f"t{i}", lease_id=f"lease{i}", group_id=f"g{i}", token_ids=[1, 2, 3],
                action_mask=[0, 1, 1], rollout_logprobs=[0.0, -0.5, -0.5], reward=1.0)
  return Trajectory(**{**kwargs, **overrides})


def _restored(log_dir) -> TrajectoryServer:
  server = TrajectoryServer(ServerConfig(log_dir=str(log_dir), vocab_size=VOCAB), TaskDispenser([{"id": "x"}]))
  server.restore()
  return server


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_logged_records_the_trainer_cannot_take_are_quarantined_once(tmp_path):
  bad = [_traj(1, reward=1e39), _traj(2, rollout_logprobs=[0.0, -3e38, -0.5]), _traj(3, policy_version=2**31),
         _traj(4, token_ids=[1] * 40000, action_mask=[1] * 40000, rollout_logprobs=[-0.1] * 40000)]
  with log_lib.TrajectoryLog(tmp_path) as log:  # e.g. written by a trainer without these limits
    log.append_batch([_traj(0), *bad, _traj(5)])
  server = _restored(tmp_path)
  stats = server.stats()
  assert (stats["accepted"], stats["buffered"], stats["quarantined"], stats["consumed"]) == (6, 2, 4, 4)
  reasons = log_lib.read_quarantined(tmp_path)
  assert sorted(reasons) == [(f"lease{i}", 0) for i in range(1, 5)]
  assert all(r.startswith("at restore:") for r in reasons.values())
  assert "OUT_OF_RANGE" in reasons[("lease1", 0)] and "TOO_LONG" in reasons[("lease4", 0)]
  server.stop()
  again = _restored(tmp_path)  # never read back for training, never quarantined twice
  assert (again.stats()["buffered"], again.stats()["quarantined"]) == (2, 0)
  assert len(log_lib.read_quarantined(tmp_path)) == 4 and [r.key for r in log_lib.unconsumed(tmp_path)] == [
      ("lease0", 0), ("lease5", 0)]
  again.stop()


def test_a_group_with_a_quarantined_sample_is_quarantined_whole(tmp_path):
  samples = [_traj(0, group_id="e0:x", sample_index=i, task_id="x", lease_id="L") for i in range(2)]
  samples[1] = Trajectory(**{**samples[1].__dict__, "reward": 1e39})
  with log_lib.TrajectoryLog(tmp_path) as log:
    log.append_batch(samples)
  server = TrajectoryServer(ServerConfig(log_dir=str(tmp_path), vocab_size=VOCAB),
                            TaskDispenser([{"id": "x"}], DispenserConfig(mode="group", group_size=2)))
  assert server.restore() == 0 and server.stats()["occupancy"] == 0  # no reservation waits for the lost sample
  assert "group mate" in log_lib.read_quarantined(tmp_path)[("L", 0)]
  server.stop()


def test_restore_reports_what_reading_the_log_lost(tmp_path):
  with log_lib.TrajectoryLog(tmp_path) as log:
    log.append_batch([_traj(i) for i in range(3)])
  (path,) = tmp_path.glob("segment-*.log")
  middle = list(log_lib.read_records(tmp_path))[1].offset
  data = bytearray(path.read_bytes())
  data[middle + 5] ^= 0x10  # the length field of the middle record
  path.write_bytes(bytes(data))
  server = _restored(tmp_path)
  stats = server.stats()
  assert stats["buffered"] == 2 and stats["log_skipped_spans"] == 1
  assert stats["log_skipped_bytes"] == list(log_lib.read_records(tmp_path))[1].offset - middle
  server.stop()
