"""Children started with `lifetime.child_env()` end when their launcher is SIGKILLed (no orphaned engines/workers)."""
import os
import signal
import subprocess
import sys
import textwrap
import time

from sao.engines import lifetime

# A launcher that starts one child which follows it, prints the child's pid, then waits to be killed.
_LAUNCHER = textwrap.dedent("""
    import subprocess, sys, time
    from sao.engines import lifetime
    child = subprocess.Popen([sys.executable, "-c",
                              "from sao.engines import lifetime; import time; "
                              "assert lifetime.exit_with_parent(); time.sleep(120)"],
                             env=lifetime.child_env())
    print(child.pid, flush=True)
    time.sleep(120)
""")


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped by init) counts as gone
    return f.read().split(")")[-1].split()[0] != "Z"


def test_child_exits_when_launcher_is_killed():
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER], stdout=subprocess.PIPE, text=True, cwd=repo,
                              env=dict(os.environ, PYTHONPATH=repo))
  child = int(launcher.stdout.readline())
  time.sleep(1.0)  # the child has made its prctl request
  assert _alive(child)
  launcher.send_signal(signal.SIGKILL)
  launcher.wait(timeout=10)
  deadline = time.monotonic() + 10
  while _alive(child) and time.monotonic() < deadline:
    time.sleep(0.1)
  assert not _alive(child), "the child outlived its SIGKILLed launcher"


def test_without_a_launcher_nothing_is_requested(monkeypatch):
  monkeypatch.delenv(lifetime.PARENT_PID_ENV, raising=False)
  assert not lifetime.exit_with_parent()
  assert lifetime.child_env({"A": "1"}) == {"A": "1", lifetime.PARENT_PID_ENV: str(os.getpid())}
