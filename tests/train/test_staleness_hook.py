"""The trainer feeds each update's log-prob mismatch to the adaptive staleness bound
(`sao.transport.staleness_control`) and moves its server's `max_outstanding`, reporting the cost in the step's row."""
from __future__ import annotations

import dataclasses
import json
import os

from sao.train.trainer import Trainer
from sao.transport import log as log_lib
from sao.transport import staleness_control
from sao.transport.dispenser import DispenserConfig, TaskDispenser
from sao.transport.server import ServerConfig, TrajectoryServer
from tests.train.helpers import VOCAB, trajectories
from tests.train.test_quarantine import BUCKETS, _config, _FakeLearner


class _MismatchedLearner(_FakeLearner):
  """Reports a high mismatch, then a calm one."""

  def __init__(self, mismatches):
    super().__init__()
    self.mismatches = list(mismatches)

  def update(self, trajs):
    super().update(trajs)
    return {"actor/logprob_mismatch": self.mismatches.pop(0)}


def test_the_trainer_moves_the_servers_bound_with_the_mismatch(tmp_path):
  log_dir = str(tmp_path / "work" / "trajectories")
  records = [dataclasses.replace(t, lease_id=f"lease{i}", group_id=f"g{i}") for i, t in enumerate(trajectories(1, 6))]
  with log_lib.TrajectoryLog(log_dir) as log:
    log.append_batch(records)
  trainer = Trainer(_config(), str(tmp_path / "work"), tokenizer=None, train_tasks=[], validation_tasks=[])
  trainer.launcher = None  # batches are ready: `_take` never waits
  server = TrajectoryServer(ServerConfig(log_dir=log_dir, vocab_size=VOCAB, max_tokens=BUCKETS[-1],
                                         max_outstanding=8), TaskDispenser([{"id": "unused"}], DispenserConfig()))
  trainer.staleness = staleness_control.from_run_config({"enabled": True, "calm_updates": 1}, 8, batch_size=2,
                                                        group_size=1)
  assert server.restore() == 6
  server.start()
  try:
    trainer._train(_MismatchedLearner([0.5, 0.5, 0.001]), None, server, None, 0, 3)  # pylint: disable=protected-access
    bound = server.stats()["max_outstanding"]
  finally:
    server.stop()
  trainer.writer.flush()
  with open(os.path.join(str(tmp_path / "work"), "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  # 8 → 4 → 2 (one batch, the floor) → 4 (calm, +one batch).
  assert [r["staleness_control/max_outstanding"] for r in rows] == [4.0, 2.0, 4.0]
  assert [r["staleness_control/withheld_sample_updates"] for r in rows] == [4.0, 10.0, 14.0]
  assert bound == 4
