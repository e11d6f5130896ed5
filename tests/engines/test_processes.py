"""sao.engines.processes.ChildProcess: readiness, restarts within a budget, errors with the log's tail, and stop()
ending the child's whole process group (its own children too)."""
from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from sao.engines import lifetime
from sao.engines import processes


def _python(code: str) -> list[str]:
  return [sys.executable, "-c", code]


def _gone(pid: int) -> bool:
  """True once `pid` no longer runs (reaped, or a zombie waiting for its reaper)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] == "Z"
  except FileNotFoundError:
    return True


def _wait_until(predicate, timeout_s: float = 20.0):
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    value = predicate()
    if value:
      return value
    time.sleep(0.05)
  raise AssertionError("condition not reached")


def test_ready_child_runs_in_its_own_group_and_follows_its_parent(tmp_path):
  log = str(tmp_path / "child.log")
  code = "import os, time; print('READY', os.environ.get('%s'), flush=True); time.sleep(60)" % lifetime.PARENT_PID_ENV
  with processes.ChildProcess("sleeper", _python(code), log).start() as child:
    line = child.wait_ready(lambda: [l for l in child.log_tail().splitlines() if l.startswith("READY")], 30)
    assert line == [f"READY {os.getpid()}"]  # lifetime.child_env: the child knows the parent it follows
    assert os.getpgid(child.pid) == child.pid != os.getpgid(0)
    assert child.alive() and child.check() is None
  assert not child.alive() and child.returncode == -signal.SIGTERM


def test_child_that_exits_before_ready_is_an_error_with_its_log_tail(tmp_path):
  child = processes.ChildProcess("engine 0", _python("import sys; print('bad model path'); sys.exit(3)"),
                                 str(tmp_path / "e.log")).start()
  with pytest.raises(processes.ChildError, match=r"(?s)engine 0 \(pid \d+\) exited with code 3.*bad model path"):
    child.wait_ready(lambda: False, 30)


def test_not_ready_in_time_is_a_timeout_with_its_log_tail(tmp_path):
  with processes.ChildProcess("slow", _python("print('loading', flush=True); import time; time.sleep(60)"),
                              str(tmp_path / "s.log")).start() as child:
    _wait_until(lambda: "loading" in child.log_tail())
    with pytest.raises(TimeoutError, match="(?s)slow .*not ready within 0.2s.*loading"):
      child.wait_ready(lambda: False, 0.2)


def test_restarts_share_one_budget_then_fail_naming_the_child(tmp_path):
  budget = processes.RestartBudget(limit=2)
  code = "import sys; print('dying', flush=True); sys.exit(5)"
  a = processes.ChildProcess("worker 0", _python(code), str(tmp_path / "a.log"), restarts=budget).start()
  b = processes.ChildProcess("worker 1", _python(code), str(tmp_path / "b.log"), restarts=budget).start()
  for child in (a, b):
    _wait_until(lambda: not child.alive())
    note = child.check()
    assert note.startswith(f"{child.name} exited with code 5; restarted it as pid {child.pid}") and "dying" in note
  assert budget.used == 2 and budget.left == 0
  _wait_until(lambda: not a.alive())
  with pytest.raises(processes.ChildError, match="(?s)worker 0 .*exited with code 5.*dying.*no restarts left after 2"):
    a.check()
  with open(a.log_path) as f:
    assert f.read().count("dying") == 2  # a restart appends to the log


def test_fresh_log_truncates_only_at_the_first_start(tmp_path):
  log = tmp_path / "x.log"
  log.write_text("old run's lines\n")
  child = processes.ChildProcess("x", _python("print('new')"), str(log), fresh_log=True,
                                 restarts=processes.RestartBudget(1)).start()
  _wait_until(lambda: not child.alive())
  child.check()
  _wait_until(lambda: not child.alive())
  assert log.read_text() == "new\nnew\n"


def test_stop_ends_the_whole_group_even_when_sigterm_is_ignored(tmp_path):
  """The child ignores SIGTERM and has a grandchild: stop() SIGKILLs the group after the timeout, both are gone."""
  pid_file = tmp_path / "grandchild.pid"
  code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
          "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
          f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
  child = processes.ChildProcess("stubborn", _python(code), str(tmp_path / "st.log"), stop_timeout_s=0.5).start()
  grandchild = int(_wait_until(lambda: pid_file.exists() and pid_file.read_text()))
  processes.stop_all([child], timeout_s=0.5)
  assert child.returncode == -signal.SIGKILL
  _wait_until(lambda: _gone(grandchild))


def test_a_dead_childs_leftovers_are_killed_before_its_restart(tmp_path):
  pid_file = tmp_path / "orphan.pid"
  code = ("import os, subprocess, sys; "
          "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
          f"open({str(pid_file)!r}, 'w').write(str(p.pid)); os._exit(1)")
  child = processes.ChildProcess("w", _python(code), str(tmp_path / "w.log"),
                                 restarts=processes.RestartBudget(1)).start()
  orphan = int(_wait_until(lambda: pid_file.exists() and pid_file.read_text()))
  _wait_until(lambda: not child.alive())
  pid_file.unlink()
  assert child.check()
  _wait_until(lambda: _gone(orphan))
  child.stop()
