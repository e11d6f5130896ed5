"""sao.engines.gpu_share (the trainer's and the engines' GPU memory shares), host_platform.runs_on_cpu, and
xla_cpu_threads.limit leaving an accelerator process's pools alone. Device files are faked with globs of a tmp dir."""
from __future__ import annotations

import pytest

from sao.engines import gpu_share, host_platform, xla_cpu_threads


@pytest.fixture
def gpu_globs(tmp_path):
  (tmp_path / "nvidia0").touch()
  return (str(tmp_path / "nvidia[0-9]*"),)


NONE = ("/nonexistent/nvidia[0-9]*",)


def test_memory_env_on_a_gpu_host(gpu_globs):
  trainer = gpu_share.memory_env("trainer", 1, {}, gpu_globs)
  engine = gpu_share.memory_env("engine", 1, {}, gpu_globs)
  assert trainer == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.700"}
  assert engine == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.250",
                    "CUDA_VISIBLE_DEVICES": "0"}
  two = gpu_share.memory_env("engine", 2, {}, gpu_globs)
  assert two["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.125"
  # the shares of every process fit in the device, with room for CUDA contexts and cuDNN workspaces
  for n in (1, 2, 4):
    total = float(gpu_share.memory_env("trainer", n, {}, gpu_globs)["XLA_PYTHON_CLIENT_MEM_FRACTION"]) + n * float(
        gpu_share.memory_env("engine", n, {}, gpu_globs)["XLA_PYTHON_CLIENT_MEM_FRACTION"])
    assert total <= 0.95 + 1e-9


def test_memory_env_sets_nothing_off_gpu_alone_or_over_the_user(gpu_globs):
  assert gpu_share.memory_env("trainer", 1, {}, NONE) == {}  # no GPU device files
  assert gpu_share.memory_env("trainer", 1, {"JAX_PLATFORMS": "cpu"}, gpu_globs) == {}
  assert gpu_share.memory_env("trainer", 0, {}, gpu_globs) == {}  # no local engine: the trainer's default
  user = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}
  assert gpu_share.memory_env("engine", 1, user, gpu_globs) == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                                                                "CUDA_VISIBLE_DEVICES": "0"}
  assert gpu_share.memory_env("engine", 1, {"JAX_PLATFORMS": "cuda"}, NONE)["XLA_PYTHON_CLIENT_PREALLOCATE"]
  with pytest.raises(ValueError, match="role must be"):
    gpu_share.memory_env("worker", 1, {}, gpu_globs)


def test_apply_updates_the_environment_and_an_engine_replaces_the_trainers_share(gpu_globs):
  env = {"PATH": "/bin"}
  added = gpu_share.apply("trainer", 1, env, gpu_globs)
  assert added and all(env[k] == v for k, v in added.items()) and env["PATH"] == "/bin"
  child = dict(env)  # what the trainer's engine inherits
  gpu_share.apply("engine", 1, child, gpu_globs)
  assert child["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.250" and env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.700"
  user = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.4"}
  gpu_share.apply("trainer", 1, user, gpu_globs)
  gpu_share.apply("engine", 1, user, gpu_globs)
  assert user["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.4"  # the user's value, in both


def test_runs_on_cpu(gpu_globs):
  assert host_platform.runs_on_cpu({}, NONE)
  assert not host_platform.runs_on_cpu({}, gpu_globs)
  assert host_platform.runs_on_cpu({"JAX_PLATFORMS": "cpu"}, gpu_globs)
  assert not host_platform.runs_on_cpu({"JAX_PLATFORMS": "cuda,cpu"}, NONE)


def test_xla_cpu_threads_not_applied_on_an_accelerator(monkeypatch):
  """An accelerator process keeps its pools (the device compiler's are sized from the same affinity mask)."""
  monkeypatch.setattr(host_platform, "runs_on_cpu", lambda *a, **k: False)
  monkeypatch.setattr(xla_cpu_threads.os, "sched_setaffinity", lambda *a: pytest.fail("affinity narrowed"))
  assert xla_cpu_threads.limit(1) is False


def test_each_engine_sees_one_gpu(tmp_path):
  for i in range(3):
    (tmp_path / f"nvidia{i}").touch()
  globs = (str(tmp_path / "nvidia[0-9]*"),)
  picks = [gpu_share.memory_env("engine", 4, {}, globs, engine_index=i)["CUDA_VISIBLE_DEVICES"] for i in range(4)]
  assert picks == ["0", "1", "2", "0"]
  user = {"CUDA_VISIBLE_DEVICES": "5,7"}  # the user's choice of GPUs: engines pick among them
  assert gpu_share.memory_env("engine", 2, user, globs, engine_index=1)["CUDA_VISIBLE_DEVICES"] == "7"
  assert "CUDA_VISIBLE_DEVICES" not in gpu_share.memory_env("trainer", 2, {}, globs)  # the trainer spans them all
