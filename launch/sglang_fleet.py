r"""Renders (and with `--execute` runs) the commands that start an SGLang fleet on GPU hosts: N inference servers
(`python -m sglang.launch_server`), optionally one `sglang_router.launch_router` in front of them, and prints the
`--config.engine_urls=...` override that points a run at the fleet.

    python -m launch.sglang_fleet --gpu_hosts=gpu-0,gpu-1 --model_path=/mnt/models/Qwen3.5-35B-A3B \
        --tp_size=4 --gpus_per_host=8 [--norouter] [--execute]

With 8 GPUs per host and `--tp_size=4` every host runs two servers: GPUs 0-3 on port 30000 and GPUs 4-7 on port
30001 (`--base-gpu-id`, consecutive ports). Each server command is, on its host (over ssh):

    python3 -m sglang.launch_server --model-path <model> --host 0.0.0.0 --port 30000 --tp-size 4 --base-gpu-id 0 \
        --mem-fraction-static 0.85 --weight-version 0 [--context-length N] [--random-seed S] [extra args]

`--weight-version 0` makes the base policy report version 0 in `meta_info.weight_version` (the trainer's policy
versions then count up from there through `/update_weights_from_disk`). The router:

    python3 -m sglang_router.launch_router --worker-urls http://gpu-0:30000 ... --host 0.0.0.0 --port 30080 \
        --policy cache_aware --health-check-interval-secs 10 --worker-startup-timeout-secs 1800

The router waits (up to `--worker-startup-timeout-secs`) for every server to answer `/health`, checks them every
`--health-check-interval-secs` afterwards, and retries a request a server refused on another one.

The engine URL the run gets is the router's (or, with `--norouter`, every server's URL; the worker round-robins
over them): the rollout workers talk to the router only. The router does not forward weight updates; the trainer
asks it for its servers (`GET /workers`) and updates each one, taking a server that fails or lags out of the
router's rotation until it has the current version (`sao.engines.fleet`, docs/fleet.md). The trainer writes new
policies to its workdir and the servers load them from the same path, so the workdir must be mounted at one path
on the trainer and every GPU host.
"""
from __future__ import annotations

import dataclasses
import shlex
import subprocess
import sys
import time
from typing import Sequence

from absl import app, flags

from launch import sweep as sweep_lib

ROUTER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")


@dataclasses.dataclass(frozen=True)
class FleetSpec:
  """An SGLang fleet: `len(gpu_hosts) * gpus_per_host // tp_size` servers, optionally behind a router.

  Attributes:
    model_path: what the servers load first (the base policy's HF directory, as the GPU hosts see it).
    gpu_hosts: ssh-able host names; servers listen on these names' ports.
    gpus_per_host: GPUs each host gives the fleet.
    tp_size: tensor parallelism of one server (`--tp-size`); must divide `gpus_per_host`.
    port: the first server port on each host; a host's k-th server uses `port + k`.
    host: the address the servers and the router bind.
    mem_fraction_static: SGLang's static memory fraction (weights + KV cache pool).
    context_length: `--context-length` (0 = the model config's).
    random_seed: `--random-seed` (None = SGLang's default).
    weight_version: the version the base policy reports (`--weight-version`).
    extra_server_args: more `sglang.launch_server` arguments, appended verbatim.
    router: start `sglang_router.launch_router` and hand out its URL.
    router_host: where the router runs ("" = the first GPU host).
    router_port: the router's port.
    router_policy: its load-balancing policy (`--policy`).
    router_health_check_interval_s: how often the router checks each server's `/health`.
    router_worker_startup_timeout_s: how long the router waits for the servers to load their model.
    python: the Python on the GPU hosts.
  """
  model_path: str
  gpu_hosts: tuple[str, ...]
  gpus_per_host: int = 8
  tp_size: int = 8
  port: int = 30000
  host: str = "0.0.0.0"
  mem_fraction_static: float = 0.85
  context_length: int = 0
  random_seed: int | None = None
  weight_version: str = "0"
  extra_server_args: tuple[str, ...] = ()
  router: bool = True
  router_host: str = ""
  router_port: int = 30080
  router_policy: str = "cache_aware"
  router_health_check_interval_s: int = 10
  router_worker_startup_timeout_s: int = 1800
  python: str = "python3"

  def __post_init__(self):
    if not self.model_path:
      raise ValueError("model_path: empty; give the HF directory the servers load")
    if not self.gpu_hosts:
      raise ValueError("gpu_hosts: empty; give at least one GPU host")
    if len(set(self.gpu_hosts)) != len(self.gpu_hosts):
      raise ValueError(f"gpu_hosts: duplicate host names in {self.gpu_hosts}")
    if self.tp_size < 1 or self.gpus_per_host < 1 or self.gpus_per_host % self.tp_size:
      raise ValueError(f"tp_size: {self.tp_size} must be >= 1 and divide gpus_per_host={self.gpus_per_host}")
    if not 0.0 < self.mem_fraction_static < 1.0:
      raise ValueError(f"mem_fraction_static: must be in (0, 1), got {self.mem_fraction_static}")
    if self.context_length < 0:
      raise ValueError(f"context_length: must be >= 0 (0 = the model's), got {self.context_length}")
    if self.router_policy not in ROUTER_POLICIES:
      raise ValueError(f"router_policy: {self.router_policy!r} is not one of {ROUTER_POLICIES}")
    if self.router_health_check_interval_s < 1 or self.router_worker_startup_timeout_s < 1:
      raise ValueError(f"router_health_check_interval_s ({self.router_health_check_interval_s}) and "
                       f"router_worker_startup_timeout_s ({self.router_worker_startup_timeout_s}) must be >= 1")
    router_host = self.router_host or self.gpu_hosts[0]
    if self.router and router_host in self.gpu_hosts:
      if self.port <= self.router_port < self.port + self.gpus_per_host // self.tp_size:
        raise ValueError(f"router_port: {self.router_port} collides with a server port on {router_host}")

  @property
  def servers_per_host(self) -> int:
    return self.gpus_per_host // self.tp_size


@dataclasses.dataclass(frozen=True)
class Command:
  """One command to run on `host` (the argv is the local `ssh` invocation)."""
  role: str  # sglang | router
  host: str
  argv: tuple[str, ...]

  def render(self) -> str:
    return shlex.join(self.argv)


def server_urls(spec: FleetSpec) -> tuple[str, ...]:
  """Every server's URL, host by host."""
  return tuple(f"http://{host}:{spec.port + k}" for host in spec.gpu_hosts for k in range(spec.servers_per_host))


def router_url(spec: FleetSpec) -> str:
  return f"http://{spec.router_host or spec.gpu_hosts[0]}:{spec.router_port}"


def engine_urls(spec: FleetSpec) -> tuple[str, ...]:
  """What the run's `engine_urls` should be: the router, or (without one) every server."""
  return (router_url(spec),) if spec.router else server_urls(spec)


def engine_urls_override(spec: FleetSpec) -> str:
  """The `experiments/train.py` flag that points a run at the fleet."""
  return f"--config.engine_urls={sweep_lib.format_value(engine_urls(spec))}"


def server_argv(spec: FleetSpec, index_on_host: int) -> list[str]:
  """The `sglang.launch_server` argv of a host's `index_on_host`-th server."""
  argv = [spec.python, "-m", "sglang.launch_server", "--model-path", spec.model_path, "--host", spec.host,
          "--port", str(spec.port + index_on_host), "--tp-size", str(spec.tp_size),
          "--base-gpu-id", str(index_on_host * spec.tp_size), "--mem-fraction-static", str(spec.mem_fraction_static),
          "--weight-version", spec.weight_version]
  if spec.context_length:
    argv += ["--context-length", str(spec.context_length)]
  if spec.random_seed is not None:
    argv += ["--random-seed", str(spec.random_seed)]
  return argv + list(spec.extra_server_args)


def router_argv(spec: FleetSpec) -> list[str]:
  return [spec.python, "-m", "sglang_router.launch_router", "--worker-urls", *server_urls(spec), "--host", spec.host,
          "--port", str(spec.router_port), "--policy", spec.router_policy,
          "--health-check-interval-secs", str(spec.router_health_check_interval_s),
          "--worker-startup-timeout-secs", str(spec.router_worker_startup_timeout_s)]


def plan(spec: FleetSpec) -> list[Command]:
  """The commands in start order: every server, then the router."""
  commands = []
  for host in spec.gpu_hosts:
    for k in range(spec.servers_per_host):
      commands.append(Command("sglang", host, ("ssh", host, shlex.join(server_argv(spec, k)))))
  if spec.router:
    host = spec.router_host or spec.gpu_hosts[0]
    commands.append(Command("router", host, ("ssh", host, shlex.join(router_argv(spec)))))
  return commands


def render(spec: FleetSpec) -> str:
  """The commands, one per line under a `# role on host` comment, then the engine_urls override."""
  lines = [f"# {c.role} on {c.host}\n{c.render()}" for c in plan(spec)]
  lines.append(f"# point the run at the fleet (experiments/train.py)\n{engine_urls_override(spec)}")
  return "\n".join(lines)


def execute(spec: FleetSpec, startup_wait_s: float = 5.0) -> int:
  """Starts the servers, waits `startup_wait_s` (their ports open; the router itself waits for them to load, up to
  `router_worker_startup_timeout_s`), starts the router, then waits for any process to exit (or Ctrl-C) and stops
  the rest. Returns the first exit code seen."""
  started: list[subprocess.Popen] = []
  commands = plan(spec)
  try:
    for i, command in enumerate(commands):
      if command.role == "router" and i:
        time.sleep(startup_wait_s)
      print(f"[sglang_fleet] {command.role} on {command.host}: {command.render()}", flush=True)
      started.append(subprocess.Popen(list(command.argv)))
    while True:
      for process in started:
        code = process.poll()
        if code is not None:
          print(f"[sglang_fleet] {shlex.join(process.args)} exited with {code}", file=sys.stderr, flush=True)
          return code
      time.sleep(5.0)
  except KeyboardInterrupt:
    return 0
  finally:
    for process in reversed(started):
      if process.poll() is None:
        process.terminate()


def define_flags() -> None:
  """The CLI's flags, defined only when run as a program."""
  flags.DEFINE_list("gpu_hosts", [], "GPU hosts (ssh-able names the run's machines can reach).")
  flags.DEFINE_string("model_path", "", "Model directory the servers load ('' = --config's model.hf_path).")
  flags.DEFINE_string("config", "", "Experiment config '<file>:<arg>' to take model.hf_path from.")
  flags.DEFINE_integer("gpus_per_host", 8, "GPUs per host.")
  flags.DEFINE_integer("tp_size", 8, "Tensor parallelism per server (servers per host = gpus_per_host / tp_size).")
  flags.DEFINE_integer("port", 30000, "First server port on each host.")
  flags.DEFINE_float("mem_fraction_static", 0.85, "SGLang --mem-fraction-static.")
  flags.DEFINE_integer("context_length", 0, "SGLang --context-length (0 = the model's).")
  flags.DEFINE_multi_string("server_arg", [], "Extra sglang.launch_server argument (repeatable, verbatim).")
  flags.DEFINE_bool("router", True, "Start sglang_router in front of the servers.")
  flags.DEFINE_string("router_host", "", "Router host ('' = the first GPU host).")
  flags.DEFINE_integer("router_port", 30080, "Router port.")
  flags.DEFINE_enum("router_policy", "cache_aware", list(ROUTER_POLICIES), "Router load-balancing policy.")
  flags.DEFINE_integer("router_health_check_interval_s", 10, "Seconds between the router's server health checks.")
  flags.DEFINE_integer("router_worker_startup_timeout_s", 1800, "How long the router waits for the servers.")
  flags.DEFINE_string("python", "python3", "Python on the GPU hosts.")
  flags.DEFINE_bool("execute", False, "Run the commands (default: print them).")


def main(argv: Sequence[str]) -> None:
  del argv
  f = flags.FLAGS
  model_path = f.model_path or (sweep_lib.load_config(f.config).model.hf_path if f.config else "")
  spec = FleetSpec(model_path=model_path, gpu_hosts=tuple(f.gpu_hosts), gpus_per_host=f.gpus_per_host,
                   tp_size=f.tp_size, port=f.port, mem_fraction_static=f.mem_fraction_static,
                   context_length=f.context_length, extra_server_args=tuple(f.server_arg), router=f.router,
                   router_host=f.router_host, router_port=f.router_port, router_policy=f.router_policy,
                   router_health_check_interval_s=f.router_health_check_interval_s,
                   router_worker_startup_timeout_s=f.router_worker_startup_timeout_s, python=f.python)
  print(render(spec), flush=True)
  if f.execute:
    sys.exit(execute(spec))


if __name__ == "__main__":
  define_flags()
  app.run(main)
