"""TPU-pod launch commands are rendered (never executed) with the flags the roles need."""
from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from launch import sweep as s
from launch import tpu_pod

CONFIG = "experiments/configs/sao_openswe.py:full"


def _spec(**kw):
  args = dict(tpu_name="sao-pod", zone="us-east5-a", project="proj", config=CONFIG, workdir="/mnt/runs/a",
              model_path="/mnt/models/qwen", gpu_hosts=("gpu-0", "gpu-1"), worker_hosts=("cpu-0",),
              trainer_host="10.0.0.2", overrides=("total_steps=10",))
  args.update(kw)
  return tpu_pod.PodSpec(**args)


def _remote_argv(command):
  """The argv run on the remote host (after `cd <repo> &&`)."""
  remote = command.argv[-1]
  if remote.startswith("--command="):
    remote = remote[len("--command="):]
  prefix, rest = remote.split(" && ", 1)
  assert prefix == "cd ~/sao"
  return shlex.split(rest)


def test_plan_order_and_roles():
  commands = tpu_pod.plan(_spec())
  assert [(c.role, c.host) for c in commands] == [("sglang", "gpu-0"), ("sglang", "gpu-1"), ("router", "gpu-0"),
                                                  ("trainer", "sao-pod"), ("worker", "cpu-0")]
  assert [c.background for c in commands] == [True, True, True, False, True]


def test_sglang_fleet_commands():
  sglang, _, router = tpu_pod.plan(_spec())[:3]
  assert sglang.argv[:2] == ("ssh", "gpu-0")
  assert _remote_argv(sglang) == ["python3", "-m", "sglang.launch_server", "--model-path", "/mnt/models/qwen",
                                  "--host", "0.0.0.0", "--port", "30000", "--tp-size", "8"]
  assert _remote_argv(router) == ["python3", "-m", "sglang_router.launch_router", "--worker-urls",
                                  "http://gpu-0:30000", "http://gpu-1:30000", "--host", "0.0.0.0", "--port", "30080",
                                  "--health-check-interval-secs", "10", "--worker-startup-timeout-secs", "1800"]


def test_trainer_command_runs_on_every_tpu_host():
  trainer = tpu_pod.plan(_spec())[3]
  assert trainer.argv[:8] == ("gcloud", "compute", "tpus", "tpu-vm", "ssh", "sao-pod", "--zone=us-east5-a",
                              "--project=proj")
  assert "--worker=all" in trainer.argv
  argv = _remote_argv(trainer)
  assert argv[:4] == ["python3", "experiments/train.py", f"--config={CONFIG}", "--workdir=/mnt/runs/a"]
  for flag in ("--config.role=trainer", "--config.jax_distributed=True", "--config.server.host=0.0.0.0",
               "--config.server.port=50051", "--config.engine_urls=('http://gpu-0:30080',)",
               "--config.total_steps=10"):
    assert flag in argv
  # The rendered line is one shell command whose --command survives quoting.
  rendered = shlex.split(trainer.render())
  assert rendered == list(trainer.argv)


def test_worker_command_and_existing_fleet():
  worker = tpu_pod.plan(_spec(workers_per_host=2))[-2:]
  assert len(worker) == 2 and worker[0].argv[:2] == ("ssh", "cpu-0")
  argv = _remote_argv(worker[0])
  assert "--config.role=worker" in argv and "--trainer=10.0.0.2:50051" in argv
  assert [_remote_argv(w)[-1] for w in worker] == ["--worker_index=0", "--worker_index=1"]
  assert f"--config={CONFIG}" in argv  # the trainer's config, not settings copied flag by flag
  assert "--config.engine_urls=('http://gpu-0:30080',)" in argv
  commands = tpu_pod.plan(_spec(gpu_hosts=(), engine_urls=("http://router:1",), project=""))
  assert [c.role for c in commands] == ["trainer", "worker"]
  assert not any(a.startswith("--project") for a in commands[0].argv)
  assert "--config.engine_urls=('http://router:1',)" in _remote_argv(commands[0])


def test_spec_errors_name_the_problem():
  with pytest.raises(ValueError, match="no engines"):
    _spec(gpu_hosts=())
  with pytest.raises(ValueError, match="trainer_host"):
    _spec(trainer_host="")
  with pytest.raises(ValueError, match="key=value"):
    _spec(overrides=("total_steps",))


def test_cli_renders_without_executing():
  result = subprocess.run([sys.executable, "-m", "launch.tpu_pod", "--tpu_name=pod", "--zone=z", f"--config={CONFIG}",
                           "--workdir=/mnt/w", "--gpu_hosts=g0"], cwd=s.REPO_ROOT, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 0, result.stderr
  assert "# trainer on pod" in result.stdout and "sglang.launch_server" in result.stdout
  assert "--model-path Qwen/Qwen3.5-35B-A3B" in result.stdout  # defaulted from the config's model.hf_path


def test_explicit_coordinates_render_one_trainer_command_per_tpu_host():
  commands = tpu_pod.plan(_spec(tpu_hosts=3, coordinator_port=9999))
  trainers = [c for c in commands if c.role == "trainer"]
  # Process 0 last and in the foreground: `execute` waits for it; the other hosts run alongside.
  assert [c.host for c in trainers] == ["sao-pod/1", "sao-pod/2", "sao-pod/0"]
  assert [c.background for c in trainers] == [True, True, False]
  for trainer, i in zip(trainers, (1, 2, 0)):
    assert f"--worker={i}" in trainer.argv and "--worker=all" not in trainer.argv
    argv = _remote_argv(trainer)
    assert argv[-3:] == ["--config.distributed.coordinator_address=10.0.0.2:9999",
                         "--config.distributed.num_processes=3", f"--config.distributed.process_id={i}"]
    assert "--config.jax_distributed=True" not in argv and "--config.role=trainer" in argv
  # Every host gets the same config: the commands differ only in the process id.
  stripped = {tuple(a for a in _remote_argv(t) if "process_id" not in a) for t in trainers}
  assert len(stripped) == 1
  with pytest.raises(ValueError, match="tpu_hosts needs trainer_host"):
    _spec(tpu_hosts=2, trainer_host="", worker_hosts=())
