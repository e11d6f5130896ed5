r"""Runs a sweep's runs on this machine, a bounded number at a time.

    python -m launch.local --sweep=launch/sweeps/toy_sao_vs_gspo.py --workdir=/tmp/sao_vs_gspo --max_parallel=1

Each run is a subprocess of `experiments/train.py` (from the repo root) in `<workdir>/<run name>`, its stdout and
stderr appended to `<that dir>/launch.log`. On success the runner writes `<that dir>/DONE`; a later invocation
skips runs with a `DONE` marker and restarts the others in the same directory, where the trainer resumes from its
latest checkpoint (a run cut off by a crash, a kill or Ctrl-C continues rather than starting over). A failed run is
reported with the tail of its log and does not stop the others; the exit status is 1 if any run failed. Every
run's overrides are checked against its config before anything starts (`launch.sweep.validate_run`).

With `--trainer_processes=P` it runs one experiment as a P-process trainer job on this machine instead (the
multi-host code path without a pod; docs/tpu.md, "Multi-host trainer"):

    python -m launch.local --trainer_processes=2 --devices_per_process=4 --workdir=/tmp/sao_2proc -- \
        --config=experiments/configs/sao_openswe.py:toy

Every process runs `experiments/train.py` with the same flags plus its coordinates
(`--config.distributed.coordinator_address=127.0.0.1:<port> --config.distributed.num_processes=P
--config.distributed.process_id=i`) on `devices_per_process` CPU devices; process 0 (whose output is this
command's) starts the embedded engines and workers, the others log to `<workdir>/logs/trainer_process<i>.log`. The
exit status is the first failure's (`sao.train.coordination.EXIT_PROCESS_LOST` when a process was lost); re-running
the same command resumes from the last checkpoint.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from typing import Callable, Sequence, TextIO

from absl import app, flags

from launch import sweep as sweep_lib

DONE = "DONE"
LOG = "launch.log"
TAIL_CHARS = 3000

PENDING, RESUME, RUNNING, DONE_STATUS, SKIPPED, FAILED, CUT_OFF = (
    "pending", "resume", "running", "done", "skipped (DONE)", "failed", "cut off")


@dataclasses.dataclass
class RunState:
  run: sweep_lib.Run
  workdir: str
  status: str = PENDING
  returncode: int | None = None
  started: float | None = None
  elapsed_s: float = 0.0
  process: subprocess.Popen | None = None

  @property
  def log_path(self) -> str:
    return os.path.join(self.workdir, LOG)


def initial_status(workdir: str) -> str:
  """skipped when `DONE` exists, resume when the directory holds an earlier attempt, else pending."""
  if os.path.isfile(os.path.join(workdir, DONE)):
    return SKIPPED
  if os.path.isdir(workdir) and os.listdir(workdir):
    return RESUME
  return PENDING


def log_tail(path: str, chars: int = TAIL_CHARS) -> str:
  if not os.path.isfile(path):
    return f"(no log at {path})"
  with open(path, "rb") as f:
    f.seek(0, os.SEEK_END)
    f.seek(max(f.tell() - chars, 0))
    return f.read().decode(errors="replace")


def last_step(workdir: str) -> str:
  """The last logged step of a run (its metrics.jsonl), for the progress table; "-" when none yet."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.isfile(path):
    return "-"
  with open(path, "rb") as f:
    f.seek(0, os.SEEK_END)
    f.seek(max(f.tell() - 4096, 0))
    lines = f.read().decode(errors="replace").splitlines()
  for line in reversed(lines):
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      continue  # a torn line being written, or the first partial line of the window
    if "step" in record:
      return str(record["step"])
  return "-"


def progress_table(states: Sequence[RunState], now: float | None = None) -> str:
  now = time.time() if now is None else now
  rows = [("run", "status", "step", "elapsed", "workdir")]
  for s in states:
    elapsed = s.elapsed_s + ((now - s.started) if s.status == RUNNING and s.started else 0.0)
    status = s.status if s.returncode in (None, 0) else f"{s.status} ({s.returncode})"
    rows.append((s.run.name, status, last_step(s.workdir), f"{elapsed:.0f}s", s.workdir))
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _start(state: RunState, command: list[str], cwd: str) -> None:
  os.makedirs(state.workdir, exist_ok=True)
  with open(state.log_path, "ab") as log:
    log.write(f"\n=== launch.local {time.strftime('%Y-%m-%d %H:%M:%S')}: {shlex.join(command)}\n".encode())
    log.flush()
    # A new session: Ctrl-C on the runner does not reach the child first; the runner forwards SIGTERM itself.
    state.process = subprocess.Popen(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
  state.status, state.started, state.returncode = RUNNING, time.time(), None


def _finish(state: RunState, returncode: int, out: TextIO) -> None:
  state.returncode = returncode
  state.elapsed_s += time.time() - (state.started or time.time())
  state.process = None
  if returncode == 0:
    with open(os.path.join(state.workdir, DONE), "w", encoding="utf-8") as f:
      json.dump({"run": state.run.name, "config": state.run.config, "overrides": dict(state.run.overrides),
                 "finished": time.time(), "elapsed_s": state.elapsed_s}, f, default=str)
    state.status = DONE_STATUS
    return
  state.status = CUT_OFF if returncode < 0 else FAILED
  why = (f"killed by signal {-returncode}; rerunning the sweep resumes it" if returncode < 0
         else f"exit code {returncode}")
  print(f"\n[launch] run {state.run.name} {state.status}: {why}; log {state.log_path}, tail:\n"
        f"{log_tail(state.log_path)}\n", file=out, flush=True)


def run_sweep(runs: Sequence[sweep_lib.Run], workdir: str, max_parallel: int = 1,
              command_fn: Callable[[sweep_lib.Run, str], list[str]] | None = None, cwd: str = sweep_lib.REPO_ROOT,
              poll_s: float = 0.5, out: TextIO = sys.stdout, report_s: float = 60.0) -> list[RunState]:
  """Runs `runs` (at most `max_parallel` at once) under `workdir`; returns each run's final state. The progress
  table is printed when a run starts or ends, and every `report_s` seconds while runs are going."""
  if max_parallel < 1:
    raise ValueError(f"max_parallel: must be >= 1, got {max_parallel}")
  sweep_lib.check_unique(runs)
  command_fn = command_fn or (lambda run, run_dir: run.command(run_dir))
  states = [RunState(r, os.path.join(os.path.abspath(workdir), r.name)) for r in runs]
  for s in states:
    s.status = initial_status(s.workdir)
  version = sweep_lib.code_version(cwd)  # one sweep, one code version (launch.sweep's module docstring)
  sweep_lib.check_code_versions([s.workdir for s in states], version)
  queue = [s for s in states if s.status in (PENDING, RESUME)]
  print(f"[launch] code version {version}", file=out, flush=True)
  print(progress_table(states), file=out, flush=True)
  running: list[RunState] = []
  last_report = time.monotonic()
  try:
    while queue or running:
      changed = time.monotonic() - last_report >= report_s
      while queue and len(running) < max_parallel:
        state = queue.pop(0)
        sweep_lib.stamp_code_version(state.workdir, version)
        _start(state, command_fn(state.run, state.workdir), cwd)
        running.append(state)
        changed = True
      for state in list(running):
        code = state.process.poll()
        if code is not None:
          running.remove(state)
          _finish(state, code, out)
          changed = True
      if changed:
        print(progress_table(states), file=out, flush=True)
        last_report = time.monotonic()
      if running:
        time.sleep(poll_s)
  except KeyboardInterrupt:
    # Stop our own children; their workdirs stay, so the next invocation resumes them.
    for state in running:
      os.killpg(state.process.pid, signal.SIGTERM)
    for state in running:
      try:
        code = state.process.wait(timeout=60)
      except subprocess.TimeoutExpired:
        os.killpg(state.process.pid, signal.SIGKILL)
        code = state.process.wait()
      _finish(state, code, out)
    print(progress_table(states), file=out, flush=True)
    raise
  return states


def dry_run(runs: Sequence[sweep_lib.Run], workdir: str, out: TextIO = sys.stdout) -> None:
  for run in runs:
    run_dir = os.path.join(os.path.abspath(workdir), run.name)
    print(f"[{initial_status(run_dir)}] {shlex.join(run.command(run_dir))}", file=out)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def trainer_job_commands(train_args: Sequence[str], workdir: str, num_processes: int, coordinator_address: str,
                         train_script: str = "experiments/train.py") -> list[list[str]]:
  """The P processes' `experiments/train.py` commands: the same flags and workdir, each with its coordinates."""
  if num_processes < 1:
    raise ValueError(f"trainer_processes: must be >= 1, got {num_processes}")
  if not any(a.startswith("--config=") for a in train_args):
    raise ValueError(f"the trainer's flags (after --) need --config=<file>:<arg>; got {list(train_args)}")
  coordinates = [f"--config.distributed.coordinator_address={coordinator_address}",
                 f"--config.distributed.num_processes={num_processes}"]
  return [[sys.executable, train_script, *train_args, f"--workdir={os.path.abspath(workdir)}",
           *coordinates, f"--config.distributed.process_id={i}"] for i in range(num_processes)]


def trainer_job_env(devices_per_process: int, env: dict[str, str] | None = None) -> dict[str, str]:
  """CPU JAX with `devices_per_process` devices (`--xla_force_host_platform_device_count`)."""
  out = dict(os.environ if env is None else env)
  flags_ = [f for f in out.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
  out["XLA_FLAGS"] = " ".join(flags_ + [f"--xla_force_host_platform_device_count={devices_per_process}"])
  out["JAX_PLATFORMS"] = "cpu"
  out["PYTHONUNBUFFERED"] = "1"
  return out


def run_trainer_job(train_args: Sequence[str], workdir: str, num_processes: int, devices_per_process: int = 1,
                    cwd: str = sweep_lib.REPO_ROOT, poll_s: float = 0.5, stop_grace_s: float = 120.0,
                    train_script: str = "experiments/train.py") -> int:
  """Runs the P-process trainer job (module docstring) until every process exits; returns 0 or the first non-zero
  exit code. Once a process fails, the others stop by themselves (a lost process is noticed within the config's
  `distributed.heartbeat_timeout_s`); any still running after `stop_grace_s` are killed."""
  commands = trainer_job_commands(train_args, workdir, num_processes, f"127.0.0.1:{free_port()}", train_script)
  log_dir = os.path.join(os.path.abspath(workdir), "logs")
  os.makedirs(log_dir, exist_ok=True)
  env = trainer_job_env(devices_per_process)
  processes: list[subprocess.Popen] = []
  first_failure, failed_at = 0, None
  try:
    for i, command in enumerate(commands):
      print(f"[launch] trainer process {i}/{num_processes}: {shlex.join(command)}", flush=True)
      if i == 0:
        out = None  # process 0 speaks for the job: its output is this command's
      else:
        out = open(os.path.join(log_dir, f"trainer_process{i}.log"), "ab")  # pylint: disable=consider-using-with
      # Its own process group (Ctrl-C reaches the launcher alone, which ends the groups), in the launcher's session.
      processes.append(subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, process_group=0))
      if out is not None:
        out.close()
    while [p.poll() for p in processes].count(None):  # polls every process (any() would stop at the first)
      for i, p in enumerate(processes):
        if p.returncode not in (None, 0) and not first_failure:
          first_failure, failed_at = p.returncode, time.monotonic()
          print(f"[launch] trainer process {i} exited with code {p.returncode}", flush=True)
      if failed_at is not None and time.monotonic() - failed_at > stop_grace_s:
        break
      time.sleep(poll_s)
  finally:
    for p in processes:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM if failed_at is None else signal.SIGKILL)
    for p in processes:
      p.wait()
  codes = [p.returncode for p in processes]
  return first_failure or next((c for c in codes if c), 0)


def define_flags() -> None:
  """The CLI's flags, defined only when run as a program (importing this module defines none)."""
  flags.DEFINE_string("sweep", None, "Sweep file (launch/sweeps/<name>.py) defining get_sweep().")
  flags.DEFINE_string("workdir", None, "Root directory; each run trains in <workdir>/<run name>.")
  flags.DEFINE_integer("max_parallel", 1, "Runs at once (each embedded run uses several processes).")
  flags.DEFINE_bool("dry_run", False, "Print the commands (and whether each would run) and exit.")
  flags.DEFINE_list("only", [], "Run only these run names.")
  flags.DEFINE_integer("trainer_processes", 0, "Instead of a sweep: run the experiment given after -- as a trainer "
                       "job of this many processes on this machine.")
  flags.DEFINE_integer("devices_per_process", 1, "With --trainer_processes: CPU devices per process.")
  flags.mark_flags_as_required(["workdir"])


def main(argv):
  f = flags.FLAGS
  if f.trainer_processes:
    if f.sweep:
      raise app.UsageError("give --sweep or --trainer_processes, not both")
    try:
      code = run_trainer_job(argv[1:], f.workdir, f.trainer_processes, f.devices_per_process)
    except ValueError as e:
      raise app.UsageError(str(e)) from e
    sys.exit(code)
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]} (the trainer's flags after -- need --trainer_processes)")
  if not f.sweep:
    raise app.UsageError("--sweep is required (or --trainer_processes with the trainer's flags after --)")
  runs = sweep_lib.load_sweep(f.sweep)
  if f.only:
    unknown = sorted(set(f.only) - {r.name for r in runs})
    if unknown:
      raise app.UsageError(f"--only: unknown run name(s) {unknown}; the sweep has {[r.name for r in runs]}")
    runs = [r for r in runs if r.name in f.only]
  for run in runs:
    sweep_lib.validate_run(run)
  if f.dry_run:
    dry_run(runs, f.workdir)
    return
  states = run_sweep(runs, f.workdir, f.max_parallel)
  failed = [s.run.name for s in states if s.status in (FAILED, CUT_OFF)]
  if failed:
    print(f"[launch] {len(failed)} run(s) did not finish: {failed}", flush=True)
    sys.exit(1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
