"""Runs untrusted model-written Python against a list of test expressions, in a resource-limited subprocess.

Whatever the program does (loop forever, crash, exhaust memory, print megabytes, fail to parse) the caller gets a
`TestReport`, never an exception: a bad program is an observation for the agent, not a failure of the rollout.
Only a failure of the sandbox itself (the interpreter cannot be started) raises.

Isolation is deliberately modest (this runs toy tasks, not adversarial code): a fresh `python -I -S` in its own
session and an empty temporary working directory, with `resource.setrlimit` applied by the child to itself before
it touches the program (address space, CPU seconds, file size, process count, core dumps), a wall-clock timeout
that kills the whole process group, and the program's own stdout/stderr discarded.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any, Sequence

# The child. Reads {"program", "tests", "limits"} from stdin; writes one JSON line to the stdout it started with.
_RUNNER = r"""
import io, json, resource, sys
req = json.loads(sys.stdin.read())
lim = req["limits"]
for name, value in (("RLIMIT_AS", lim["memory_bytes"]), ("RLIMIT_CPU", lim["cpu_seconds"]),
                    ("RLIMIT_FSIZE", lim["file_bytes"]), ("RLIMIT_NPROC", 0), ("RLIMIT_CORE", 0)):
  if hasattr(resource, name):
    try:
      resource.setrlimit(getattr(resource, name), (value, value))
    except (ValueError, OSError):
      pass  # a hard limit already lower than ours (e.g. NPROC under some containers) is at least as strict
out = sys.stdout
sys.stdout = sys.stderr = io.StringIO()
def short(x, n=40):
  r = repr(x)
  return r if len(r) <= n else r[:n - 3] + "..."
def report(obj):
  out.write(json.dumps(obj) + "\n")
  out.flush()
ns = {"__name__": "__program__"}
try:
  code = compile(req["program"], "program.py", "exec")
except SyntaxError as e:
  report({"error": f"SyntaxError line {e.lineno}: {e.msg}"})
  raise SystemExit(0)
try:
  exec(code, ns)
except BaseException as e:
  report({"error": f"{type(e).__name__} while loading: {short(str(e))}"})
  raise SystemExit(0)
results = []
for expr, expected in req["tests"]:
  try:
    got = eval(expr, ns)
  except BaseException as e:
    results.append([False, f"{expr} raised {type(e).__name__}"])
    continue
  if got == expected and type(got) is type(expected):
    results.append([True, ""])
  else:
    results.append([False, f"{expr} == {short(expected)}, got {short(got)}"])
report({"results": results})
"""


@dataclasses.dataclass(frozen=True)
class TestReport:
  """Outcome of running a program's tests.

  Attributes:
    total: number of tests.
    passed: number passing (0 when the program did not load, timed out or crashed).
    failures: one short line per failing test ("f(3) == 6, got 5", "f([]) raised ZeroDivisionError").
    error: why no test could run (syntax error, exception at load time, crash), else None.
    timed_out: the wall-clock timeout killed the run.
  """
  __test__ = False  # not a pytest test class, despite the name

  total: int
  passed: int
  failures: tuple[str, ...] = ()
  error: str | None = None
  timed_out: bool = False

  @property
  def all_passed(self) -> bool:
    return self.error is None and not self.timed_out and self.passed == self.total

  def summary(self) -> str:
    """A short observation for the agent: the count and the first failure."""
    if self.timed_out:
      return "timeout: tests did not finish"
    if self.error is not None:
      return f"error: {self.error}"
    text = f"{self.passed}/{self.total} passed"
    if self.failures:
      text += f"; fail: {self.failures[0]}"
    return text


def run_tests(program: str, tests: Sequence[tuple[str, Any]], timeout_s: float = 2.0,
              memory_mb: int = 256, file_kb: int = 1024) -> TestReport:
  """Runs `program` then evaluates each `(expression, expected)` in a limited subprocess.

  A test passes iff the expression's value equals `expected` and has the same type (so `True` does not pass for
  `1`). `expected` must be JSON-serialisable.
  """
  request = json.dumps({
      "program": program,
      "tests": [[expr, expected] for expr, expected in tests],
      "limits": {"memory_bytes": memory_mb << 20, "cpu_seconds": int(timeout_s) + 1, "file_bytes": file_kb << 10},
  })
  with tempfile.TemporaryDirectory(prefix="sao_sandbox_") as cwd:
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _RUNNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, cwd=cwd, env={"PATH": os.environ.get("PATH", "")}, start_new_session=True,
        text=True)
    try:
      stdout, stderr = proc.communicate(request, timeout=timeout_s)
    except subprocess.TimeoutExpired:
      _kill_group(proc)
      proc.communicate()
      return TestReport(total=len(tests), passed=0, timed_out=True)
  lines = stdout.strip().splitlines()
  if not lines:
    # Killed by a signal (e.g. SIGXCPU, SIGKILL from the OOM killer) or died before reporting.
    tail = stderr.strip().splitlines()[-1:] or [""]
    return TestReport(total=len(tests), passed=0, error=f"crashed (exit {proc.returncode}) {tail[0][:60]}".strip())
  try:
    result = json.loads(lines[-1])
  except json.JSONDecodeError:  # the program wrote to file descriptor 1 behind the runner's back
    return TestReport(total=len(tests), passed=0, error="unreadable test output")
  if "error" in result:
    return TestReport(total=len(tests), passed=0, error=result["error"])
  outcomes = result["results"]
  return TestReport(total=len(tests), passed=sum(ok for ok, _ in outcomes),
                    failures=tuple(detail for ok, detail in outcomes if not ok))


def _kill_group(proc: subprocess.Popen) -> None:
  """SIGKILLs the child's whole session (it may have spawned helpers despite RLIMIT_NPROC, e.g. as root)."""
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass  # already gone: exactly what we wanted
