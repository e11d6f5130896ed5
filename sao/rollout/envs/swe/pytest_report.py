"""The grader's pytest runner: runs pytest in-process with a reporting plugin of its own, and prints one report.

Runs *inside* the grading sandbox as `python -c <this file's source>` (cwd /testbed first on sys.path, as with
`python -m pytest`), reading {"nonce", "args"} as JSON from stdin. Outcomes come from pytest's own per-phase reports
(`pytest_runtest_logreport`), not from parsing the terminal output, so text the code under test prints (say, a fake
"PASSED tests/x.py::test_y" line at exit) is not a result. The report goes out last, through a copy of the original
stdout taken before pytest starts, as one line `<nonce> <json>`; the nonce came over stdin, which is consumed
before any repository code runs, so the repository cannot print a well-formed report of its own by accident or
from its files. (Code under test shares the process with pytest, so it could still patch pytest in memory: see
docs/security.md.)

Outcome words as pytest's `-rA` summary: PASSED, FAILED, ERROR (setup/teardown failed), SKIPPED, XFAIL, XPASS.
Test ids are relative to the working directory, as `-rA` prints them. Standard library + pytest only.
"""
from __future__ import annotations

import json
import os
import sys


def outcome_word(report) -> str:
  """The -rA word for one phase report (`report.when` in setup/call/teardown)."""
  xfail = hasattr(report, "wasxfail")
  if report.when == "call":
    if report.passed:
      return "XPASS" if xfail else "PASSED"
    if report.skipped:
      return "XFAIL" if xfail else "SKIPPED"
    return "FAILED"
  if report.failed:
    return "ERROR"
  if report.skipped:
    return "XFAIL" if xfail else "SKIPPED"
  return ""  # a passing setup/teardown says nothing on its own


class Recorder:
  """A pytest plugin: test id -> outcome word; a later non-empty word wins (teardown ERROR after a PASSED call)."""

  def __init__(self):
    self.outcomes: dict[str, str] = {}
    self.config = None

  def pytest_configure(self, config):
    self.config = config

  def pytest_runtest_logreport(self, report):
    word = outcome_word(report)
    if word:
      test_id = report.nodeid
      if self.config is not None and hasattr(self.config, "cwd_relative_nodeid"):
        test_id = self.config.cwd_relative_nodeid(report.nodeid)
      if not (word == "PASSED" and self.outcomes.get(test_id) == "ERROR"):
        self.outcomes[test_id] = word

  def pytest_collectreport(self, report):
    if report.failed:  # a module that cannot be collected: its tests are missing (so failing)
      self.outcomes.setdefault(f"<collection>::{report.nodeid}", "ERROR")


def main() -> int:
  request = json.loads(sys.stdin.read())
  sys.stdin.close()
  out = os.dup(1)
  nonce = request["nonce"]
  recorder = Recorder()
  import pytest  # after the copy of stdout: pytest's capture rewires fd 1
  code = pytest.main(list(request["args"]), plugins=[recorder])
  os.write(out, f"\n{nonce} {json.dumps({'exit': int(code), 'outcomes': recorder.outcomes})}\n".encode())
  os.close(out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
