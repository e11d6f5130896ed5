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
import jax, jax.monitoring, jax.numpy as jnp
from experiments.configs import sao_openswe
from launch import run
hits = []
jax.monitoring.register_event_listener(lambda event, **kw: hits.append(event) if event.endswith("cache_hits") else None)
run._persistent_compilation_cache(sao_openswe.get_config("toy," + sys.argv[2]), sys.argv[1])
jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.25)(jnp.arange(7.0)).block_until_ready()
print(len(hits), jax.config.jax_compilation_cache_dir)
"""


def _compile_in_a_trainer(workdir: str, config_overrides: str, env: dict[str, str]) -> tuple[int, str]:
  """A fresh process (JAX decides once per process whether its cache is in use) that sets up the trainer's cache
  and compiles one program; returns (persistent-cache hits, the cache directory)."""
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = subprocess.run([sys.executable, "-c", _COMPILE_IN_A_TRAINER, workdir, config_overrides],
                       env=dict(env, JAX_PLATFORMS="cpu", PYTHONPATH=repo), cwd=repo, capture_output=True, text=True,
                       timeout=120, check=True).stdout.split()
  return int(out[-2]), out[-1]


def test_trainer_compilation_cache_is_shared_by_runs_unless_configured_otherwise(tmp_path):
  """The trainer's XLA executables go to `<compilation_cache_dir>/trainer` (one for a job's processes), by default under
  `$SAO_CACHE_DIR` (else `~/.cache/sao`), where a later run with another workdir loads them instead of compiling;
  `compilation_cache_dir=""` keeps them in `<workdir>/jax_cache`; a cache the user configured for JAX itself
  (JAX_COMPILATION_CACHE_DIR) is never overridden."""
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
  env["SAO_CACHE_DIR"] = str(tmp_path / "user_cache")
  shared = str(tmp_path / "user_cache" / "xla" / "trainer")
  assert _compile_in_a_trainer(str(tmp_path / "run_a"), "", env) == (0, shared)
  hits, cache = _compile_in_a_trainer(str(tmp_path / "run_b"), "", env)  # another run: its compiles hit the cache
  assert hits > 0 and cache == shared

  in_run = str(tmp_path / "run_c" / "jax_cache" / "trainer")
  assert _compile_in_a_trainer(str(tmp_path / "run_c"), "compilation_cache_dir=", env) == (0, in_run)
  assert any(n.endswith("-cache") for n in os.listdir(in_run))

  # With the user's own JAX settings (JAX's default would skip compiles under a second).
  configured = str(tmp_path / "jax_configured")
  env.update(JAX_COMPILATION_CACHE_DIR=configured, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  assert _compile_in_a_trainer(str(tmp_path / "run_d"), "", env) == (0, configured)
  assert any(n.endswith("-cache") for n in os.listdir(configured))
  assert not os.path.exists(tmp_path / "run_d" / "jax_cache")


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
