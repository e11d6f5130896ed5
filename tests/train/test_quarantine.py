"""The learner's last line: a logged record that still cannot be batched is quarantined (logged, counted,
persisted) and never re-read, instead of failing every step, and every restart, that reads it.

Before: batching ran before the batch was marked consumed, so a poisoned record (reward 1e39: "non-finite";
policy_version 2^31: int32 overflow) raised in every step that took it and was restored after every restart.
"""
from __future__ import annotations

import dataclasses

import ml_collections
import pytest

from sao.train import batching
from sao.train.trainer import Trainer
from sao.transport import log as log_lib
from sao.transport.dispenser import DispenserConfig, TaskDispenser
from sao.transport.server import ServerConfig, TrajectoryServer
from sao.transport.trajectory import Trajectory

from tests.train.helpers import VOCAB, trajectories

BUCKETS = (16, 32)
# The poison itself: float32(1e39) is inf.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")


def _poisoned(good: Trajectory, **fields) -> Trajectory:
  return dataclasses.replace(good, **fields)


def test_split_unbatchable_sets_aside_only_the_records_that_fail():
  good = trajectories(0, n=4)
  bad_reward = _poisoned(good[0], task_id="bad-reward", reward=1e39)
  bad_version = _poisoned(good[1], task_id="bad-version", policy_version=2**31)
  batcher = batching.Batcher(BUCKETS)
  usable, unusable = batching.split_unbatchable([good[0], bad_reward, good[1], bad_version, *good[2:]], batcher)
  assert [t.task_id for t in usable] == [t.task_id for t in good]
  assert [t.task_id for t, _ in unusable] == ["bad-reward", "bad-version"]
  assert "non-finite" in unusable[0][1] and "int32" in unusable[1][1]
  batching.check_batch(batcher(usable)[0])  # what is left batches
  assert batching.split_unbatchable(good, batcher) == (good, [])
  assert batching.split_unbatchable([], batcher) == ([], [])


class _FakeLearner:
  """What `Trainer._train` needs of a learner, without a model: it batches like the real one and records what it
  was asked to train on."""

  def __init__(self):
    self.version = self.num_updates = 0  # the learner clock a multi-process trainer shares with each batch
    self.batcher = batching.Batcher(BUCKETS)
    self.trained: list[list[str]] = []

  def update(self, trajs):
    batch, _ = self.batcher(trajs)
    batching.check_batch(batch)  # the real learner's first check: a poisoned record used to raise here
    self.trained.append([t.task_id for t in trajs])
    return {}


def _config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      seed=0, log_every=1, critic_trace_every=0, rollout=dict(batch_size=2),
      server=dict(max_staleness=4), learner=dict(algorithm="sao")))


def _server(log_dir: str) -> TrajectoryServer:
  # A loose reward bound so that the poisoned record passes restore's content check: it stands for whatever
  # still gets through to batching.
  config = ServerConfig(log_dir=log_dir, vocab_size=VOCAB, max_tokens=BUCKETS[-1], max_abs_reward=1e300)
  return TrajectoryServer(config, TaskDispenser([{"id": "unused"}], DispenserConfig()))


def test_trainer_quarantines_a_poisoned_logged_record_once_and_keeps_training(tmp_path):
  log_dir = str(tmp_path / "work" / "trajectories")
  good = [dataclasses.replace(t, lease_id=f"lease{i}", group_id=f"g{i}") for i, t in enumerate(trajectories(1, 3))]
  poison = dataclasses.replace(good[0], task_id="poison", lease_id="poison", group_id="gp", reward=1e39)
  with log_lib.TrajectoryLog(log_dir) as log:  # accepted before the limits existed, say
    log.append_batch([poison, *good, dataclasses.replace(good[0], lease_id="lease3", group_id="g3")])
  trainer = Trainer(_config(), str(tmp_path / "work"), tokenizer=None, train_tasks=[], validation_tasks=[])
  trainer.launcher = None  # batches are ready: `_take` never waits
  learner, server = _FakeLearner(), _server(log_dir)
  assert server.restore() == 5
  server.start()
  try:
    trainer._train(learner, None, server, None, 0, 2)  # pylint: disable=protected-access
    stats = server.stats()
  finally:
    server.stop()
  assert learner.trained == [[good[0].task_id], [good[1].task_id, good[2].task_id]]  # step 0 lost only the poison
  assert stats["quarantined"] == 1 and stats["consumed"] == 4 and stats["buffered"] == 1
  assert [row["quarantined"] for row in trainer.history] == [1.0, 0.0]
  quarantined = log_lib.read_quarantined(log_dir)
  assert list(quarantined) == [("poison", 0)] and "non-finite" in quarantined[("poison", 0)]

  restarted = _server(log_dir)  # the poison is never buffered again; the unconsumed good record is
  assert restarted.restore() == 1
  restarted.start()
  try:
    assert [t.lease_id for t in restarted.take_batch(1, timeout_s=1)] == ["lease3"]
    assert restarted.stats()["quarantined"] == 0  # counted once, by the run that found it
  finally:
    restarted.stop()
  assert len(log_lib.read_quarantined(log_dir)) == 1
