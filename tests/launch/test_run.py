"""launch.run: the config flags handed to workers parse back to the trainer's config; role errors."""
from __future__ import annotations

import os

import pytest
from absl import flags
from ml_collections import config_flags

from launch import run as run_lib

CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "experiments", "configs", "sao_openswe.py")


def _parse(argv):
  fv = flags.FlagValues()
  holder = config_flags.DEFINE_config_file("config", None, "", flag_values=fv, sys_argv=["prog", *argv])
  fv(["prog", *argv])
  return holder, fv


def test_config_flag_args_give_a_worker_the_trainers_config():
  argv = [f"--config={CONFIG}:swe_toy,seed=3", "--config.rollout.concurrency=5", "--config.jax_distributed=True",
          "--config.engine_urls=('http://a:1', 'http://b:2')", "--config.learner.sao.dis_ratio_high=3.5",
          "--config.rollout.eval_harness=bash_only"]
  holder, fv = _parse(argv)
  args = run_lib.config_flag_args(fv["config"])
  assert args[0] == f"--config={CONFIG}:swe_toy,seed=3"
  again, _ = _parse(args)
  assert again.value.to_dict() == holder.value.to_dict()
  assert again.value.rollout.concurrency == 5 and again.value.engine_urls == ("http://a:1", "http://b:2")


def test_roles_and_worker_address_are_checked():
  holder, _ = _parse([f"--config={CONFIG}:toy", "--config.role=nobody"])
  with pytest.raises(ValueError, match="unknown role 'nobody'"):
    run_lib.run(holder.value, "/tmp/unused", [])
  holder, _ = _parse([f"--config={CONFIG}:toy", "--config.role=worker"])
  with pytest.raises(ValueError, match="--trainer=host:port"):
    run_lib.run(holder.value, "/tmp/unused", [])


def test_distributed_keys_are_checked_before_joining_a_job():
  holder, _ = _parse([f"--config={CONFIG}:toy"])
  assert run_lib.join_job(holder.value) is False  # one process: nothing to join, as before
  for flags_, message in ((["--config.distributed.num_processes=2"], "needs distributed.coordinator_address"),
                          (["--config.distributed.num_processes=2", "--config.distributed.process_id=2",
                            "--config.distributed.coordinator_address=127.0.0.1:1"], r"process_id 2 must be in \[0"),
                          (["--config.distributed.num_processes=2", "--config.jax_distributed=True",
                            "--config.distributed.coordinator_address=127.0.0.1:1"], "not both")):
    holder, _ = _parse([f"--config={CONFIG}:toy", *flags_])
    with pytest.raises(ValueError, match=message):
      run_lib.join_job(holder.value)
