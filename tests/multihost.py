"""Runs a Python script or module as P cooperating CPU JAX processes on this machine (a multi-host job in miniature).

    results = run_processes("tests/train/multihost_learner_worker.py", num_processes=2, devices_per_process=4,
                            args=["--out", out_dir], timeout_s=300)

Each process gets `XLA_FLAGS=--xla_force_host_platform_device_count=<devices_per_process>`, `JAX_PLATFORMS=cpu`, and
the job's coordinates in the environment (`SAO_COORDINATOR_ADDRESS` = 127.0.0.1:<free port>, `SAO_NUM_PROCESSES`,
`SAO_PROCESS_ID`); the script joins the job with `initialize_from_env()` (which selects gloo collectives through
`sao.train.distributed.initialize`). With `num_processes=1` the script runs alone (no distributed runtime), the
reference a P-process run is compared with. If any process exits non-zero or the job outlives `timeout_s`, every
process is killed and `MultihostError` says which failed, with the tail of each process's output.

This is a helper, not a test file (pytest does not collect it).
"""
from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV_ADDRESS, ENV_NUM, ENV_ID = "SAO_COORDINATOR_ADDRESS", "SAO_NUM_PROCESSES", "SAO_PROCESS_ID"
_TAIL_CHARS = 3000


class MultihostError(RuntimeError):
  """A process of the job failed or the job timed out; the message names the process and holds the output tails."""


@dataclasses.dataclass
class ProcessResult:
  process_id: int
  returncode: int
  output: str  # stdout and stderr, interleaved


def compilation_cache_env(cache_dir: str) -> dict[str, str]:
  """Environment for a child process that reads and writes JAX's persistent compilation cache in `cache_dir`, every
  program included (JAX skips programs that compile in under a second, or whose entry is small, by default)."""
  return {"JAX_COMPILATION_CACHE_DIR": cache_dir, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
          "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def initialize_from_env() -> int:
  """In a worker: joins the job the harness started (a no-op when it runs as one process); returns the process id."""
  num = int(os.environ.get(ENV_NUM, "1"))
  if num == 1:
    return 0
  from sao.train import distributed  # imports jax: only after the harness's environment is in place
  distributed.initialize(os.environ[ENV_ADDRESS], num, int(os.environ[ENV_ID]), initialization_timeout_s=120,
                         heartbeat_timeout_s=30)
  return int(os.environ[ENV_ID])


def _command(script: str, args: Sequence[str]) -> list[str]:
  if script.endswith(".py"):
    path = script if os.path.isabs(script) else os.path.join(REPO_ROOT, script)
    return [sys.executable, "-u", path, *args]
  return [sys.executable, "-u", "-m", script, *args]


def _environment(devices_per_process: int, num_processes: int, process_id: int, address: str,
                 extra: dict[str, str] | None) -> dict[str, str]:
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
  env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={devices_per_process}"])
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = os.pathsep.join([REPO_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
  env.update({ENV_ADDRESS: address, ENV_NUM: str(num_processes), ENV_ID: str(process_id)})
  env.update(extra or {})
  return env


def _tails(results: Sequence[ProcessResult]) -> str:
  return "\n".join(f"--- process {r.process_id} (exit {r.returncode}), last output:\n{r.output[-_TAIL_CHARS:]}"
                   for r in results)


def run_processes(script: str, num_processes: int = 2, devices_per_process: int = 4, args: Sequence[str] = (),
                  timeout_s: float = 300.0, env: dict[str, str] | None = None,
                  check: bool = True) -> list[ProcessResult]:
  """Starts `script` (a path ending in .py, relative to the repository root or absolute, or a module name) as
  `num_processes` processes with the same `args`, waits for all, returns their results in process order.

  `check`: raise `MultihostError` if any exits non-zero. On `timeout_s` every process is killed and
  `MultihostError` is raised regardless of `check`."""
  if num_processes < 1 or devices_per_process < 1:
    raise ValueError(f"run_processes: num_processes={num_processes} and devices_per_process={devices_per_process} "
                     "must be >= 1")
  address = f"127.0.0.1:{free_port()}"
  procs, logs = [], []
  try:
    for i in range(num_processes):
      log = tempfile.TemporaryFile(mode="w+")
      logs.append(log)
      procs.append(subprocess.Popen(_command(script, args), cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                    env=_environment(devices_per_process, num_processes, i, address, env),
                                    start_new_session=True))
    deadline = time.monotonic() + timeout_s
    timed_out = False
    while any(p.poll() is None for p in procs):
      if time.monotonic() > deadline:
        timed_out = True
        break
      # A failed process leaves the others blocked in a collective until the heartbeat timeout: stop them now.
      if any(p.poll() not in (None, 0) for p in procs):
        time.sleep(2.0)  # let the survivors print their own error first
        break
      time.sleep(0.2)
  finally:
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
      p.wait()
  results = []
  for i, (p, log) in enumerate(zip(procs, logs)):
    log.seek(0)
    results.append(ProcessResult(i, p.returncode, log.read()))
    log.close()
  if timed_out:
    raise MultihostError(f"{script}: the {num_processes}-process job did not finish within {timeout_s:.0f} s; all "
                         f"killed\n{_tails(results)}")
  failed = [r.process_id for r in results if r.returncode != 0]
  if check and failed:
    raise MultihostError(f"{script}: process(es) {failed} of {num_processes} failed\n{_tails(results)}")
  return results
