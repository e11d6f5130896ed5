r"""Starts a run on a TPU pod slice with an SGLang GPU fleet and remote rollout workers: renders the commands, and
with `--execute` runs them (in order: SGLang servers, router, trainer on every TPU host, rollout workers).

    python -m launch.tpu_pod --tpu_name=sao-v5p-128 --zone=us-east5-a --project=my-project \
        --config=experiments/configs/sao_openswe.py:full --workdir=/mnt/shared/sao_openswe \
        --gpu_hosts=gpu-0,gpu-1 --worker_hosts=cpu-0,cpu-1 --trainer_host=10.0.0.2 [--execute]

- SGLang: `python -m sglang.launch_server --model-path <hf_path> --host 0.0.0.0 --port 30000 --tp-size 8` on each
  GPU host (over ssh), then `python -m sglang_router.launch_router --worker-urls http://gpu-0:30000 ... --port 30080`
  on the router host (the first GPU host unless `--router_host`).
- Trainer: `gcloud compute tpus tpu-vm ssh <tpu> --worker=all --command="cd <repo> && python experiments/train.py
  ... --config.role=trainer --config.jax_distributed=True --config.engine_urls=('http://<router>:30080',)
  --config.server.host=0.0.0.0 --config.server.port=50051"` — one process per TPU host; JAX detects the job, and
  process 0 (host 0) serves gRPC, writes metrics and publishes weights (docs/tpu.md, "Multi-host trainer"). With
  `--tpu_hosts=N` (where auto-detection is not available, or to pin the coordinator) it renders one command per host
  instead, `--worker=<i>` with explicit coordinates: `--config.distributed.coordinator_address=<trainer_host>:
  <coordinator_port> --config.distributed.num_processes=N --config.distributed.process_id=<i>`.
- Rollout workers: `python experiments/train.py ... --config.role=worker --trainer=<trainer_host>:50051
  --worker_index=<i>` per worker process (over ssh), reading the trainer's config and talking to the same router.

The engines load new policies with `/update_weights_from_disk`, so `--workdir` must be a filesystem every TPU and
GPU host mounts at the same path. Set `SAO_TRAINER_TOKEN` in the environment of the trainer and worker hosts (the
commands never carry secrets).
"""
from __future__ import annotations

import dataclasses
import shlex
import subprocess
import sys
import time
from typing import Sequence

from absl import app, flags

from launch import sglang_fleet as fleet_lib
from launch import sweep as sweep_lib


@dataclasses.dataclass(frozen=True)
class PodSpec:
  """Where everything runs. Hosts are ssh-able names; `trainer_host` is TPU host 0's address seen by workers."""
  tpu_name: str
  zone: str
  config: str  # "<file>:<arg>", relative to the repo root
  workdir: str
  model_path: str  # what SGLang serves first (the base policy's HF directory)
  project: str = ""
  repo_dir: str = "~/sao"  # the repo's checkout on every host
  python: str = "python3"
  gpu_hosts: tuple[str, ...] = ()
  gpus_per_host: int = 8  # SGLang tensor parallelism: one server per GPU host
  sglang_port: int = 30000
  router_host: str = ""  # "" = the first GPU host
  router_port: int = 30080
  engine_urls: tuple[str, ...] = ()  # an existing fleet/router instead of gpu_hosts
  worker_hosts: tuple[str, ...] = ()
  workers_per_host: int = 1
  trainer_host: str = ""
  trainer_port: int = 50051
  tpu_hosts: int = 0  # > 0: one trainer command per TPU host with explicit coordinates (else JAX auto-detects)
  coordinator_port: int = 8476  # the JAX coordination service on TPU host 0 (with tpu_hosts)
  overrides: tuple[str, ...] = ()  # extra "key=value" config overrides for trainer and workers

  def __post_init__(self):
    if not self.gpu_hosts and not self.engine_urls:
      raise ValueError("no engines: give gpu_hosts (start an SGLang fleet) or engine_urls (an existing one)")
    if self.gpu_hosts and self.engine_urls:
      raise ValueError("give either gpu_hosts or engine_urls, not both")
    if self.worker_hosts and not self.trainer_host:
      raise ValueError("worker_hosts need trainer_host: the address of TPU host 0 as the workers see it")
    if self.tpu_hosts < 0:
      raise ValueError(f"tpu_hosts: must be >= 0, got {self.tpu_hosts}")
    if self.tpu_hosts and not self.trainer_host:
      raise ValueError("tpu_hosts needs trainer_host: TPU host 0's address, where the coordinator listens")
    for item in self.overrides:
      if "=" not in item:
        raise ValueError(f"override {item!r} is not key=value")


@dataclasses.dataclass(frozen=True)
class Command:
  """One local command; `background` ones are long-running servers started before the next step."""
  role: str  # sglang | router | trainer | worker
  host: str
  argv: tuple[str, ...]
  background: bool = True

  def render(self) -> str:
    return shlex.join(self.argv)


def _remote(spec: PodSpec, argv: Sequence[str]) -> str:
  return f"cd {spec.repo_dir} && " + shlex.join(argv)


def router_url(spec: PodSpec) -> str:
  return f"http://{spec.router_host or spec.gpu_hosts[0]}:{spec.router_port}"


def _engine_urls(spec: PodSpec) -> tuple[str, ...]:
  return spec.engine_urls or (router_url(spec),)


def _train_argv(spec: PodSpec, role: str) -> list[str]:
  overrides = [f"--config.{item}" for item in spec.overrides]
  return [spec.python, "experiments/train.py", f"--config={spec.config}", f"--workdir={spec.workdir}",
          f"--config.role={role}", f"--config.engine_urls={sweep_lib.format_value(_engine_urls(spec))}", *overrides]


def plan(spec: PodSpec) -> list[Command]:
  """The commands, in start order."""
  commands = []
  for host in spec.gpu_hosts:
    server = [spec.python, "-m", "sglang.launch_server", "--model-path", spec.model_path, "--host", "0.0.0.0",
              "--port", str(spec.sglang_port), "--tp-size", str(spec.gpus_per_host)]
    commands.append(Command("sglang", host, ("ssh", host, _remote(spec, server))))
  if spec.gpu_hosts:
    host = spec.router_host or spec.gpu_hosts[0]
    router = [spec.python, "-m", "sglang_router.launch_router", "--worker-urls",
              *[f"http://{h}:{spec.sglang_port}" for h in spec.gpu_hosts], "--host", "0.0.0.0",
              "--port", str(spec.router_port),
              # As launch/sglang_fleet.py: wait for the servers to load, then health-check them.
              "--health-check-interval-secs", str(fleet_lib.FleetSpec.router_health_check_interval_s),
              "--worker-startup-timeout-secs", str(fleet_lib.FleetSpec.router_worker_startup_timeout_s)]
    commands.append(Command("router", host, ("ssh", host, _remote(spec, router))))
  commands += trainer_commands(spec)
  index = 0
  for host in spec.worker_hosts:
    worker = _train_argv(spec, "worker") + [f"--trainer={spec.trainer_host}:{spec.trainer_port}"]
    for _ in range(spec.workers_per_host):
      # Every worker reads the trainer's config; only the trainer's address and its own index are its flags.
      commands.append(Command("worker", host, ("ssh", host, _remote(spec, worker + [f"--worker_index={index}"]))))
      index += 1
  return commands


def trainer_commands(spec: PodSpec) -> list[Command]:
  """The trainer on every TPU host: one `--worker=all` command (JAX detects the job), or with `tpu_hosts` one command
  per host with its explicit coordinates. Process 0's command is the one `execute` waits for (the last one)."""
  trainer = _train_argv(spec, "trainer") + ["--config.server.host=0.0.0.0", f"--config.server.port={spec.trainer_port}"]
  gcloud = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", spec.tpu_name, f"--zone={spec.zone}"]
  gcloud += [f"--project={spec.project}"] if spec.project else []
  if not spec.tpu_hosts:
    argv = trainer + ["--config.jax_distributed=True"]
    return [Command("trainer", spec.tpu_name, tuple(gcloud + ["--worker=all", f"--command={_remote(spec, argv)}"]),
                    background=False)]
  coordinates = [f"--config.distributed.coordinator_address={spec.trainer_host}:{spec.coordinator_port}",
                 f"--config.distributed.num_processes={spec.tpu_hosts}"]
  commands = []
  for i in [*range(1, spec.tpu_hosts), 0]:  # process 0 last: `execute` waits for it
    argv = trainer + coordinates + [f"--config.distributed.process_id={i}"]
    commands.append(Command("trainer", f"{spec.tpu_name}/{i}", tuple(gcloud + [
        f"--worker={i}", f"--command={_remote(spec, argv)}"]), background=i != 0))
  return commands


def render(commands: Sequence[Command]) -> str:
  return "\n".join(f"# {c.role} on {c.host}\n{c.render()}" for c in commands)


def execute(commands: Sequence[Command], startup_wait_s: float = 30.0) -> int:
  """Starts every command in order (servers get `startup_wait_s` to come up); returns the trainer's exit code and
  then stops the processes this function started."""
  started: list[tuple[Command, subprocess.Popen]] = []
  trainer_code = 0
  try:
    for i, command in enumerate(commands):
      print(f"[tpu_pod] {command.role} on {command.host}: {command.render()}", flush=True)
      started.append((command, subprocess.Popen(list(command.argv))))
      last_of_group = i + 1 == len(commands) or commands[i + 1].role != command.role
      if command.role in ("sglang", "router") and last_of_group:
        time.sleep(startup_wait_s)  # the next group connects to these servers
    trainer = [p for c, p in started if c.role == "trainer" and not c.background]  # process 0 (or --worker=all)
    trainer_code = trainer[0].wait() if trainer else 0
  finally:
    for _, process in reversed(started):
      if process.poll() is None:
        process.terminate()
  return trainer_code


def define_flags() -> None:
  """The CLI's flags, defined only when run as a program."""
  flags.DEFINE_string("tpu_name", None, "TPU VM (pod slice) name.")
  flags.DEFINE_string("zone", None, "TPU zone.")
  flags.DEFINE_string("project", "", "GCP project ('' = gcloud's default).")
  flags.DEFINE_string("config", None, "Experiment config, '<file>:<arg>'.")
  flags.DEFINE_string("workdir", None, "Run directory on a filesystem shared by TPU and GPU hosts.")
  flags.DEFINE_string("model_path", "", "Model SGLang serves first ('' = the config's model.hf_path).")
  flags.DEFINE_string("repo_dir", "~/sao", "The repo's checkout on every host.")
  flags.DEFINE_string("python", "python3", "Python on the remote hosts.")
  flags.DEFINE_list("gpu_hosts", [], "GPU hosts, one SGLang server each.")
  flags.DEFINE_integer("gpus_per_host", 8, "SGLang --tp-size.")
  flags.DEFINE_string("router_host", "", "Router host ('' = the first GPU host).")
  flags.DEFINE_list("engine_urls", [], "An existing SGLang fleet/router instead of --gpu_hosts.")
  flags.DEFINE_list("worker_hosts", [], "Rollout worker hosts.")
  flags.DEFINE_integer("workers_per_host", 1, "Worker processes per worker host.")
  flags.DEFINE_string("trainer_host", "", "TPU host 0's address as the workers see it.")
  flags.DEFINE_integer("trainer_port", 50051, "The trainer's gRPC port.")
  flags.DEFINE_integer("tpu_hosts", 0, "> 0: one trainer command per TPU host with explicit JAX coordinates "
                       "(coordinator on --trainer_host); 0: --worker=all and JAX's auto-detection.")
  flags.DEFINE_integer("coordinator_port", 8476, "With --tpu_hosts: the JAX coordinator's port on TPU host 0.")
  flags.DEFINE_multi_string("override", [], "Extra config override key=value (repeatable).")
  flags.DEFINE_bool("execute", False, "Run the commands (default: print them).")
  flags.mark_flags_as_required(["tpu_name", "zone", "config", "workdir"])


def main(argv):
  del argv
  f = flags.FLAGS
  model_path = f.model_path or sweep_lib.load_config(f.config).model.hf_path
  spec = PodSpec(tpu_name=f.tpu_name, zone=f.zone, project=f.project, config=f.config, workdir=f.workdir,
                 model_path=model_path, repo_dir=f.repo_dir, python=f.python, gpu_hosts=tuple(f.gpu_hosts),
                 gpus_per_host=f.gpus_per_host, router_host=f.router_host, engine_urls=tuple(f.engine_urls),
                 worker_hosts=tuple(f.worker_hosts), workers_per_host=f.workers_per_host,
                 trainer_host=f.trainer_host, trainer_port=f.trainer_port, tpu_hosts=f.tpu_hosts,
                 coordinator_port=f.coordinator_port, overrides=tuple(f.override))
  commands = plan(spec)
  print(render(commands), flush=True)
  if f.execute:
    sys.exit(execute(commands))


if __name__ == "__main__":
  define_flags()
  app.run(main)
