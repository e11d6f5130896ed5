"""`sao.train.stop_signal`: SIGTERM sets the stop flag and, when the main thread is stuck in native code (a
collective that never returns), the watcher ends the process after the grace period, naming its phase."""
import os
import subprocess
import sys
import textwrap

from sao.train import stop_signal

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(body: str) -> subprocess.CompletedProcess:
  script = textwrap.dedent("""
      import os, signal, sys, threading, time
      from sao.train import stop_signal
      """) + textwrap.dedent(body)
  return subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                        env=dict(os.environ, PYTHONPATH=REPO), check=False)


def test_sigterm_sets_the_flag_and_a_running_loop_stops_itself():
  proc = _run("""
      stop = stop_signal.StopSignal.install(grace_s=60, describe=lambda: "rl step 3: update")
      os.kill(os.getpid(), signal.SIGTERM)
      deadline = time.monotonic() + 30
      while not stop.requested and time.monotonic() < deadline:
        time.sleep(0.01)  # the loop's step boundary
      stop.exited()
      print("STOPPED", stop.requested)
      """)
  assert proc.returncode == 0, proc.stderr
  assert "STOPPED True" in proc.stdout


def test_a_main_thread_blocked_in_native_code_is_ended_after_the_grace_naming_its_phase():
  # The main thread waits in a C call that never returns by itself (as in a collective no peer joins): the Python
  # handler cannot run, the watcher still sees the signal.
  proc = _run("""
      stop = stop_signal.StopSignal.install(grace_s=1.0, describe=lambda: "value_pretrain step 2: update")
      threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
      r, w = os.pipe()
      os.read(r, 1)  # blocks forever in native code
      """)
  assert proc.returncode == stop_signal.EXIT_SIGTERM, (proc.returncode, proc.stderr)
  assert "still running after 1 s (value_pretrain step 2: update)" in proc.stderr


def test_exited_gives_sigterm_back():
  proc = _run("""
      stop = stop_signal.StopSignal.install(grace_s=60)
      stop.exited()
      print("HANDLER", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, flush=True)
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(5)
      print("SURVIVED")
      """)
  assert "HANDLER True" in proc.stdout and "SURVIVED" not in proc.stdout and proc.returncode == -15


def test_off_the_main_thread_install_never_fires():
  box = []
  import threading
  t = threading.Thread(target=lambda: box.append(stop_signal.StopSignal.install(grace_s=1)))
  t.start()
  t.join()
  assert not box[0].requested
  box[0].exited()
