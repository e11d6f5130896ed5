"""experiments/bench/bench_pipeline.py: the config arg it hands the trainer and the rollout worker, and its
`--critic_epochs` knob (a trainer-only way to lengthen the learner's step; docs/fleet_simulation.md, 'a busy trainer')."""
from __future__ import annotations

import os

import pytest

from experiments.bench import bench_pipeline
from experiments.configs import sao_openswe


def test_critic_epochs_reaches_the_learner_config_and_nothing_on_the_rollout_side():
  base = sao_openswe.get_config(bench_pipeline.config_arg(32, 5, 16, 64))
  busy = sao_openswe.get_config(bench_pipeline.config_arg(32, 5, 16, 64, critic_epochs=13))
  assert base.learner.sao.critic_epochs == 2  # 0: the toy config's own K
  assert busy.learner.sao.critic_epochs == 13
  assert busy.rollout.to_dict() == base.rollout.to_dict() and busy.model.to_dict() == base.model.to_dict()
  assert busy.rollout.concurrency == 64 and busy.rollout.batch_size == 16 and busy.server.buffer_capacity == 64


def test_negative_critic_epochs_is_refused():
  with pytest.raises(ValueError, match="critic_epochs"):
    bench_pipeline.config_arg(32, 5, 16, 16, critic_epochs=-1)


def test_the_worker_config_file_is_the_experiment_config():
  """The rollout worker process loads the config by path: from experiments/bench/ it is one folder up."""
  assert os.path.samefile(bench_pipeline._CONFIG_FILE, sao_openswe.__file__)  # pylint: disable=protected-access
