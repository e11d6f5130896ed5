"""Child processes of a launcher (engine servers, rollout workers): start, wait until ready, restart, stop.

    worker = ChildProcess("rollout worker 0", [sys.executable, "-m", "sao.rollout.worker", ...], "logs/worker0.log",
                          restarts=RestartBudget(10)).start()
    ...
    note = worker.check()       # None while it runs; a restart message after it died (ChildError when out of budget)
    worker.stop()               # SIGTERM to its whole process group, SIGKILL after `stop_timeout_s`

Each child runs in its own process group (so `stop()` also ends what it started: sandboxes, scaffolds) and ends
with its parent (`lifetime.child_env`: the child asks the kernel for SIGTERM when the launcher dies). Its stdout and
stderr go to one log file; every error names the child, its exit code and the log's last lines. No JAX import.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from typing import Any, Callable, Mapping, Sequence, TypeVar

from sao.engines import lifetime

T = TypeVar("T")
TAIL_CHARS = 4000


class ChildError(RuntimeError):
  """A child process exited when it should not have (before it was ready, or with no restarts left)."""


@dataclasses.dataclass
class RestartBudget:
  """Restarts a set of children may use in total (children given the same budget share it); 0 = none."""
  limit: int
  used: int = 0

  @property
  def left(self) -> int:
    return self.limit - self.used


def read_tail(path: str, n_chars: int = TAIL_CHARS) -> str:
  """The last `n_chars` characters of the file at `path` (a note instead if it cannot be read)."""
  try:
    with open(path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(f.tell() - 4 * n_chars, 0))  # utf-8: at most 4 bytes a character
      return f.read().decode(errors="replace")[-n_chars:]
  except OSError as e:
    return f"(log {path} unreadable: {e})"


class ChildProcess:
  """One child process; `start()` it, then `check()`, `wait_ready()`, `stop()` (or use it as a context manager).

  Args:
    name: how errors and messages name it ("engine 0", "rollout worker 1").
    argv: its command line.
    log_path: where its stdout and stderr go (appended; `fresh_log` truncates it at the first start).
    env: its environment (default: this process's), plus the parent pid it follows (`lifetime.child_env`).
    restarts: the budget `check()` restarts it from after it exits; None = never restarted.
    stop_timeout_s: how long `stop()` waits after SIGTERM before SIGKILL.
  """

  def __init__(self, name: str, argv: Sequence[str], log_path: str, *, env: Mapping[str, str] | None = None,
               cwd: str | None = None, restarts: RestartBudget | None = None, fresh_log: bool = False,
               stop_timeout_s: float = 20.0):
    if not argv:
      raise ValueError(f"{name}: empty command line")
    self.name = name
    self.argv = list(argv)
    self.log_path = log_path
    self.env = lifetime.child_env(env)
    self.cwd = cwd
    self.restarts = restarts
    self.fresh_log = fresh_log
    self.stop_timeout_s = stop_timeout_s
    self.process: subprocess.Popen | None = None

  # -------------------------------------------------------------------------------------------------------- state
  @property
  def pid(self) -> int | None:
    return self.process.pid if self.process is not None else None

  @property
  def returncode(self) -> int | None:
    """None while it runs (or before it started); its exit code after (negative: killed by that signal)."""
    return self.process.poll() if self.process is not None else None

  def alive(self) -> bool:
    return self.process is not None and self.process.poll() is None

  def log_tail(self, n_chars: int = TAIL_CHARS) -> str:
    return read_tail(self.log_path, n_chars)

  def _exit_report(self) -> str:
    return f"{self.name} (pid {self.pid}) exited with code {self.returncode}; log {self.log_path} ends:\n" + \
        self.log_tail()

  # ----------------------------------------------------------------------------------------------------- lifecycle
  def start(self) -> ChildProcess:
    """Spawns the child (a no-op while it runs); returns self."""
    if self.alive():
      return self
    mode = "wb" if self.fresh_log and self.process is None else "ab"
    os.makedirs(os.path.dirname(os.path.abspath(self.log_path)), exist_ok=True)
    with open(self.log_path, mode) as log_file:
      # Its own process group: stop() ends its descendants too. Spawned from the calling (main) thread, which the
      # child's parent-death signal is tied to (`lifetime`).
      self.process = subprocess.Popen(self.argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=self.env, cwd=self.cwd, process_group=0)
    return self

  def wait_ready(self, ready: Callable[[], T], timeout_s: float, poll_s: float = 0.05) -> T:
    """Polls `ready()` until it returns something truthy, which is returned. ChildError if the child exits first,
    TimeoutError after `timeout_s`; both carry the log's tail (and the child is left as it is: `stop()` it)."""
    deadline = time.monotonic() + timeout_s
    while True:
      if not self.alive():
        raise ChildError(f"{self._exit_report()}\n(it exited before it was ready)")
      value = ready()
      if value:
        return value
      if time.monotonic() > deadline:
        raise TimeoutError(f"{self.name} (pid {self.pid}) not ready within {timeout_s:g}s; log {self.log_path} "
                           f"ends:\n{self.log_tail()}")
      time.sleep(poll_s)

  def check(self) -> str | None:
    """None while the child runs. After it exited: restarts it and returns a message saying so (with the log's tail)
    while its restart budget lasts; otherwise raises ChildError."""
    if self.process is None:
      raise ChildError(f"{self.name}: not started")
    if self.alive():
      return None
    report, code = self._exit_report(), self.returncode
    self._signal_group(signal.SIGKILL)  # whatever it started and left behind
    if self.restarts is None or self.restarts.left <= 0:
      used = f" after {self.restarts.used} restart(s)" if self.restarts else ""
      raise ChildError(f"{report}\n(no restarts left{used})")
    tail = self.log_tail(1000)
    self.restarts.used += 1
    self.start()
    return (f"{self.name} exited with code {code}; restarted it as pid {self.pid} (restart "
            f"{self.restarts.used}/{self.restarts.limit}). Its log ended:\n{tail}")

  def stop(self, timeout_s: float | None = None) -> None:
    """SIGTERM to the child's process group; SIGKILL to it if the child is still there after `timeout_s`."""
    if self.process is None:
      return
    timeout_s = self.stop_timeout_s if timeout_s is None else timeout_s
    if self.process.poll() is None:
      self._signal_group(signal.SIGTERM)
      try:
        self.process.wait(timeout_s)
      except subprocess.TimeoutExpired:
        pass
    self._signal_group(signal.SIGKILL)  # the child if it ignored SIGTERM, and any descendant left behind
    self.process.wait()

  def _signal_group(self, sig: int) -> None:
    try:
      os.killpg(self.process.pid, sig)
    except ProcessLookupError:
      pass  # nothing left in the group
    except PermissionError:  # a reused pgid that is not ours (the group emptied long ago)
      pass

  def __enter__(self) -> ChildProcess:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.stop()


def stop_all(children: Sequence[ChildProcess], timeout_s: float = 20.0) -> None:
  """SIGTERM to every child first, then waits for each (so stopping N children takes one timeout, not N)."""
  for child in children:
    if child.alive():
      child._signal_group(signal.SIGTERM)  # pylint: disable=protected-access
  deadline = time.monotonic() + timeout_s
  for child in children:
    child.stop(max(deadline - time.monotonic(), 0.0))
