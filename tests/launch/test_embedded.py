"""launch.embedded: the engines' bucket flags, the workers' command line, and worker restarts within the run's budget
(real `python -m sao.rollout.worker` processes, pointed at a trainer address nobody serves)."""
from __future__ import annotations

import os
import signal
import time

import pytest

from experiments.configs import sao_openswe
from launch import embedded
from sao.engines import processes

CONFIG_ARGS = ["--config=experiments/configs/sao_openswe.py:toy", "--config.rollout.concurrency=2"]


def test_bucket_arithmetic():
  assert embedded.batch_buckets(64) == [7, 15, 23, 31]  # at most MAX_BATCH_ROWS rows a batch
  assert embedded.batch_buckets(24) == [6, 12, 18, 24]
  assert embedded.batch_buckets(8) == [2, 4, 6, 8]
  assert embedded.batch_buckets(1) == [1]
  assert embedded.prompt_buckets(192) == [64, 128, 192]
  assert embedded.prompt_buckets(64) == [64]
  assert embedded.prompt_buckets(6144) == [64, 128, 256, 512, 1024, 2048, 4096, 6144]
  assert embedded.suffix_buckets(192) == [16, 32, 64, 128, 192]  # a later turn's few new tokens: a short suffix
  assert embedded.suffix_buckets(32) == [16, 32]


def test_engine_args_fit_the_rollouts():
  args = embedded.engine_args(sao_openswe.get_config("toy"), "/c")
  assert args == ["--max_batch_size=31", "--batch_window_ms=5", "--max_queued_rows=4096", "--new_token_buckets=16",
                  "--batch_buckets=7,15,23,31", "--prompt_buckets=64,128,192",
                  "--suffix_buckets=16,32,64,128,192", "--compilation_cache_dir=/c",
                  "--compilation_cache_max_gb=4.0", "--xla_cpu_threads=1"]
  # The toy's processes share a few cores (one-thread XLA pools); at full scale the trainer owns its host.
  assert "--xla_cpu_threads=0" in embedded.engine_args(sao_openswe.get_config("toy,xla_cpu_threads=0"), "/c")
  assert sao_openswe.get_config("full").xla_cpu_threads == 0


def test_engine_queue_bound_comes_from_the_config():
  """`engine_max_queued_rows` reaches the engine's command line; its default is the engine's own."""
  from sao.engines.local_engine import EngineConfig  # pylint: disable=g-import-not-at-top
  assert sao_openswe.get_config("toy").engine_max_queued_rows == EngineConfig.max_queued_rows
  args = embedded.engine_args(sao_openswe.get_config("toy,engine_max_queued_rows=256"), "/c")
  assert "--max_queued_rows=256" in args
  with pytest.raises(ValueError, match="engine_max_queued_rows: must be >= 1, got 0"):
    embedded.engine_args(sao_openswe.get_config("toy,engine_max_queued_rows=0"), "/c")


def test_started_engine_command_carries_the_queue_bound(tmp_path, monkeypatch):
  from sao.engines import local_server  # pylint: disable=g-import-not-at-top
  started = []
  monkeypatch.setattr(local_server, "start_local_engine",
                      lambda model_dir, **kw: (started.append(kw["engine_args"]) or object(), "http://127.0.0.1:1"))
  children = embedded.EmbeddedProcesses(sao_openswe.get_config("toy,engine_max_queued_rows=32"), str(tmp_path),
                                        CONFIG_ARGS)
  assert children.start_engines("/model") == ["http://127.0.0.1:1"]
  assert len(started) == 1 and "--max_queued_rows=32" in started[0]


def test_an_engine_sharing_the_trainers_gpu_gets_its_memory_share(tmp_path, monkeypatch):
  """On a GPU host the engine's environment has preallocation off and its own fraction, replacing the trainer's
  (launch.run sets that in its own environment first); on this CPU host nothing is added."""
  from sao.engines import gpu_share, local_server  # pylint: disable=g-import-not-at-top
  envs = []
  monkeypatch.setattr(local_server, "start_local_engine",
                      lambda model_dir, **kw: (envs.append(kw["env"]) or object(), "http://127.0.0.1:1"))
  config = sao_openswe.get_config("toy")
  for name in ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE", gpu_share.SET_BY_US):
    monkeypatch.setenv(name, "")  # recorded, so that the test ends with this process's environment as it was
    monkeypatch.delenv(name)
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  embedded.EmbeddedProcesses(config, str(tmp_path), CONFIG_ARGS).start_engines("/model")
  assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in envs[-1]
  monkeypatch.setenv("JAX_PLATFORMS", "cuda")  # what a GPU host's JAX runs on
  gpu_share.apply("trainer", config.num_engines)  # as launch.run does in the trainer process
  embedded.EmbeddedProcesses(config, str(tmp_path), CONFIG_ARGS).start_engines("/model")
  assert envs[-1]["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
  assert envs[-1]["XLA_PYTHON_CLIENT_MEM_FRACTION"] == f"{gpu_share.ENGINES_FRACTION / config.num_engines:.3f}"
  assert os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == f"{gpu_share.TRAINER_FRACTION:.3f}"


def test_external_engines_start_nothing(tmp_path):
  children = embedded.EmbeddedProcesses(sao_openswe.get_config("toy,engine_urls=http://a:1+http://b:2"),
                                        str(tmp_path), CONFIG_ARGS)
  assert children.start_engines("/unused") == ["http://a:1", "http://b:2"] and not children.engines


def test_workers_get_the_trainers_config_flags_and_the_repository_on_their_path(tmp_path):
  children = embedded.EmbeddedProcesses(sao_openswe.get_config("toy"), str(tmp_path), CONFIG_ARGS)
  worker = children.worker(1, "127.0.0.1:9")
  assert worker.argv[1:] == ["-m", "sao.rollout.worker", *CONFIG_ARGS, "--trainer=127.0.0.1:9", "--worker_index=1"]
  assert worker.env["PYTHONPATH"].split(os.pathsep)[0] == embedded.REPO_ROOT
  assert worker.log_path == os.path.join(str(tmp_path), "logs", "worker1.log")


def test_dead_workers_are_restarted_until_the_budget_is_spent(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(embedded, "MAX_WORKER_RESTARTS", 1)
  monkeypatch.chdir(embedded.REPO_ROOT)  # the config path is relative, as on the trainer's command line
  children = embedded.EmbeddedProcesses(sao_openswe.get_config("toy,num_workers=2"), str(tmp_path), CONFIG_ARGS)
  children.start_workers("127.0.0.1:1")  # nobody serves it: the workers keep retrying their lease call
  try:
    first = children.workers[0]
    old_pid = first.pid
    children.check_alive()
    os.kill(old_pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while first.alive() and time.monotonic() < deadline:
      time.sleep(0.05)
    children.check_alive()
    assert "rollout worker 0 exited with code -9; restarted it as pid" in capsys.readouterr().out
    assert first.pid != old_pid and first.alive()
    os.kill(children.workers[1].pid, signal.SIGKILL)
    children.workers[1].process.wait(30)
    with pytest.raises(processes.ChildError, match="rollout worker 1 .*exited with code -9"):
      children.check_alive()
  finally:
    children.stop()
  assert not any(w.alive() for w in children.workers)


def test_several_engines_need_the_router_and_say_how_to_install_it(tmp_path, monkeypatch):
  from sao.engines import router as router_lib  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(router_lib.importlib.util, "find_spec", lambda name: None)
  children = embedded.EmbeddedProcesses(sao_openswe.get_config("toy,num_engines=2"), str(tmp_path), CONFIG_ARGS)
  with pytest.raises(ImportError, match=r'sglang-router is not installed.*pip install -e "\.\[test\]"'):
    children.start_engines("/unused")
  assert not children.engines  # nothing was started


def test_behind_a_router_a_dead_engine_is_reported_and_the_run_goes_on(tmp_path, capsys):
  """Engines and router stood in for by short-lived processes: the check is about what `check_alive` does."""
  import sys  # pylint: disable=g-import-not-at-top
  children = embedded.EmbeddedProcesses(sao_openswe.get_config("toy,num_engines=2"), str(tmp_path), CONFIG_ARGS)
  sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
  children.engines = [processes.ChildProcess(f"engine {i}", sleeper, str(tmp_path / f"e{i}.log")).start()
                      for i in range(2)]
  children.router = processes.ChildProcess("router", sleeper, str(tmp_path / "router.log")).start()
  try:
    children.check_alive()
    children.engines[1].stop(timeout_s=5)
    children.check_alive()  # one engine left: reported once, no error
    children.check_alive()
    out = capsys.readouterr().out
    assert out.count("engine 1 (pid") == 1 and "the run goes on with the other engines" in out
    children.router.stop(timeout_s=5)
    with pytest.raises(processes.ChildError, match="router .*exited"):
      children.check_alive()
    children.router.start()
    children.engines[0].stop(timeout_s=5)
    with pytest.raises(processes.ChildError, match=r"every engine behind the router exited \(engine 0, engine 1\)"):
      children.check_alive()  # the last engine behind the router is gone
  finally:
    children.stop()
