"""launch.run: the config flags handed to workers parse back to the trainer's config; role errors."""
from __future__ import annotations

import os
import subprocess
import sys

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


_COMPILE_IN_A_TRAINER = """
import sys
import jax, jax.numpy as jnp
from launch import run
run._persistent_compilation_cache(sys.argv[1], 1)
jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.25)(jnp.arange(7.0)).block_until_ready()
print(jax.config.jax_compilation_cache_dir)
"""


def test_trainer_compilation_cache_goes_to_the_workdir_unless_one_is_configured(tmp_path):
  """The trainer's XLA executables persist (a resume or re-run skips its compiles), in `<workdir>/jax_cache/
  process<i>`, or in the cache the user configured (JAX_COMPILATION_CACHE_DIR), which is never overridden. A fresh
  process each: JAX decides once per process whether its cache is in use."""
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=repo)
  for configured in (None, str(tmp_path / "shared")):
    if configured:  # with the user's own settings (JAX's default would skip compiles under a second)
      env.update(JAX_COMPILATION_CACHE_DIR=configured, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    workdir = str(tmp_path / f"run_{bool(configured)}")
    out = subprocess.run([sys.executable, "-c", _COMPILE_IN_A_TRAINER, workdir], env=env, cwd=repo,
                         capture_output=True, text=True, timeout=120, check=True).stdout.split()[-1]
    expected = configured or os.path.join(workdir, "jax_cache", "process1")
    assert out == expected
    assert any(n.endswith("-cache") for n in os.listdir(expected))
    assert os.path.isdir(os.path.join(workdir, "jax_cache")) == (configured is None)


def test_trainer_roles_keep_freed_memory_before_training(monkeypatch):
  calls = []
  monkeypatch.setattr(run_lib.host_malloc, "keep_freed_memory", lambda: calls.append("keep_freed_memory"))
  monkeypatch.setattr(run_lib, "train", lambda config, workdir, args: calls.append(f"train {config.role}"))
  monkeypatch.setattr(run_lib, "work", lambda config, address, index: calls.append("work"))
  for role in ("embedded", "trainer", "worker"):
    holder, _ = _parse([f"--config={CONFIG}:toy", f"--config.role={role}"])
    run_lib.run(holder.value, "/tmp/unused", [], trainer_address="127.0.0.1:1")
  # The worker runs no XLA programs of note; the trainer's settings go in before JAX starts its thread pools.
  assert calls == ["keep_freed_memory", "train embedded", "keep_freed_memory", "train trainer", "work"]
