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


def _watched() -> dict[tuple, object]:
  """Every attribute of pytest's and pluggy's modules (and of the classes they define) and of `builtins`, by
  reference: what code under test would have to replace to change how tests are run or reported."""
  import builtins
  out: dict[tuple, object] = {("builtins", k): v for k, v in vars(builtins).items()}
  for name, module in list(sys.modules.items()):
    if module is None or name.split(".")[0] not in ("pytest", "_pytest", "pluggy"):
      continue
    out[("sys.modules", name)] = module
    for attr, value in list(vars(module).items()):
      out[(name, attr)] = value
      if isinstance(value, type) and getattr(value, "__module__", None) == name:
        for key, member in list(vars(value).items()):
          out[(name, attr, key)] = member
  return out


def tampering(before: dict[tuple, object], after: dict[tuple, object]) -> list[str]:
  """What was replaced, removed or (in `builtins`) added between two `_watched` snapshots."""
  found = [".".join(map(str, key)) + (" replaced" if key in after else " removed")
           for key, value in before.items() if after.get(key, _MISSING) is not value]
  found += [f"builtins.{key[1]} added" for key in after if key[0] == "builtins" and key not in before]
  return found


_MISSING = object()


def _foreign_hooks(config, own: tuple, changed: set[str], root: str) -> list[str]:
  """Hook implementations not from pytest, pluggy, the Python installation or an unchanged repository file:
  registered at run time by code under test (exec'd code, or a module the model patch changed)."""
  trusted_roots = tuple(os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
  found = []
  for name in dir(config.hook):
    caller = getattr(config.hook, name, None)
    for impl in getattr(caller, "get_hookimpls", lambda: [])():
      if any(impl.plugin is plugin for plugin in own):
        continue
      code = getattr(getattr(impl.function, "__wrapped__", impl.function), "__code__", None)
      where = os.path.realpath(code.co_filename) if code is not None and os.path.isabs(code.co_filename) else ""
      inside = where.startswith(root + os.sep)
      if not where or (inside and os.path.relpath(where, root) in changed) or not (
          inside or where.startswith(trusted_roots)):
        found.append(f"hook {name} from {code.co_filename if code else impl.function!r}")
  return found


def main() -> int:
  request = json.loads(sys.stdin.read())
  sys.stdin.close()
  out = os.dup(1)
  nonce = request["nonce"]
  # The grader's configuration, outside the tree: no rootdir file, environment variable or entry point adds to it.
  for name in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS"):
    os.environ.pop(name, None)
  os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
  import tempfile
  config_name, config_text = request["config"]
  config_path = os.path.join(tempfile.mkdtemp(prefix="sao_grader_"), config_name)
  with open(config_path, "w", encoding="utf-8") as f:
    f.write(config_text)
  root = os.path.realpath(os.getcwd())
  recorder = Recorder()
  import pytest  # after the copy of stdout: pytest's capture rewires fd 1
  import importlib
  from _pytest.config import default_plugins
  for name in default_plugins:  # loaded during the run otherwise, too late to be watched (skipping, unittest, ...)
    try:
      importlib.import_module(f"_pytest.{name}")
    except ImportError:
      pass
  before = _watched()
  seen: list[str] = []
  changed = set(request.get("changed", ()))

  class Watch:
    """After each test phase: trace or profile functions set, hook implementations registered by code under test."""

    def pytest_runtest_logreport(self, report):
      import threading
      for what, hook in (("sys.settrace", sys.gettrace()), ("sys.setprofile", sys.getprofile()),
                         ("threading.settrace", threading.gettrace()),
                         ("threading.setprofile", threading.getprofile())):
        if hook is not None:
          seen.append(f"{what} active after {report.nodeid} ({report.when})")
      if recorder.config is not None and report.when != "setup":
        seen.extend(_foreign_hooks(recorder.config, (recorder, self), changed, root))

  code = pytest.main(["-c", config_path, "--rootdir", root, "--confcutdir", root, "-p", "no:cacheprovider",
                      *request["args"]], plugins=[recorder, Watch()])
  found = list(dict.fromkeys(seen + tampering(before, _watched())))
  report = {"exit": int(code), "outcomes": recorder.outcomes, "tampering": found[:20]}
  os.write(out, f"\n{nonce} {json.dumps(report)}\n".encode())
  os.close(out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
