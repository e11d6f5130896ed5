"""A phase's steps (`sao.train.phase_steps`) on a fake learner and a real trajectory service: every
`critic_trace_every` SAO steps the update is traced and one success and one failure are dumped with the critic's
per-token view; a stop request before a step saves the learner (where the phase keeps checkpoints) and raises
`StopRequested` naming the step."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sao.analysis import critic_traces
from sao.train import stop_signal
from sao.train.trainer import Trainer
from sao.transport import log as log_lib
from sao.transport.dispenser import DispenserConfig, TaskDispenser
from sao.transport.server import ServerConfig, TrajectoryServer
from tests.train.helpers import VOCAB, trajectories
from tests.train.test_quarantine import BUCKETS, _config, _FakeLearner


class _TracedLearner(_FakeLearner):
  """`update_traced` returns constant per-token values, returns and advantages for the rows asked for, and saves
  record their `extra`."""

  def __init__(self):
    super().__init__()
    self.saved: list[dict] = []

  def make_batch(self, trajs):
    return self.batcher(trajs)

  def update_traced(self, batch, rows):
    self.num_updates += 1
    length = np.shape(batch["input_ids"])[1]
    per_token = {"values": 0.5, "returns": 1.0, "advantages": 0.25}
    return {}, {k: np.full((len(rows), length), v, np.float32) for k, v in per_token.items()}

  def save_checkpoint(self, checkpointer, extra=None):
    self.saved.append(extra)


class _NoCheckpointsYet:
  """A checkpointer holding no step and never due: a stop must save the learner itself."""

  def all_steps(self):
    return []

  def wait(self):
    pass

  def is_due(self, step):
    return False


def test_traced_steps_dump_both_kinds_and_a_stop_saves_then_raises(tmp_path):
  log_dir = str(tmp_path / "work" / "trajectories")
  records = [dataclasses.replace(t, lease_id=f"lease{i}", group_id=f"g{i}", reward=float(i % 2))
             for i, t in enumerate(trajectories(1, 4))]
  with log_lib.TrajectoryLog(log_dir) as log:
    log.append_batch(records)
  config = _config()
  config.critic_trace_every = 1
  trainer = Trainer(config, str(tmp_path / "work"), tokenizer=None, train_tasks=[], validation_tasks=[])
  trainer.launcher = None  # batches are ready: `_take` never waits
  server = TrajectoryServer(ServerConfig(log_dir=log_dir, vocab_size=VOCAB, max_tokens=BUCKETS[-1]),
                            TaskDispenser([{"id": "unused"}], DispenserConfig()))
  assert server.restore() == 4
  server.start()
  learner = _TracedLearner()
  try:
    trainer._train(learner, None, server, None, 0, 2)  # pylint: disable=protected-access
    traces = critic_traces.read_traces(trainer.workdir)
    assert sorted((t.step, t.kind) for t in traces) == [(0, "failure"), (0, "success"), (1, "failure"),
                                                        (1, "success")]
    assert all(t.reward > 0 if t.kind == "success" else t.reward <= 0 for t in traces)
    assert all(np.all(t.values == 0.5) and np.all(t.advantages == 0.25) for t in traces)
    trainer.stop.request()
    with pytest.raises(stop_signal.StopRequested, match="before rl step 2; checkpoint at learner update 2"):
      trainer._train(learner, None, server, _NoCheckpointsYet(), 2, 4)  # pylint: disable=protected-access
  finally:
    server.stop()
    trainer.writer.close()
  assert [extra["step"] for extra in learner.saved] == [2] and learner.saved[0]["phase"] == "rl"
  assert [row["step"] for row in trainer.history] == [0, 1]  # the stopped step wrote no row
