"""The suite's scheduling under the README's `-n 2 --dist loadgroup` (`tests/conftest.py`): every test of
`MULTIPROCESS_TESTS` runs exactly once, all of them on one worker (so never two at a time, and a module's fixture is
set up once), while the other tests spread over the workers.

Checked by what happens, not by an output format: a subprocess runs the suite's own command on those files plus a
one-process file, with a plugin that records each test's worker (`PYTEST_XDIST_WORKER`) at setup and then skips it,
so only collection and scheduling cost time. (pytest-xdist's own `@group` node-id suffix is no evidence: pytest 9.2
dropped it and the grouping broke silently, pytest-xdist issue 1386.)
"""
import collections
import json
import os
import subprocess
import sys

from tests import conftest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD_PLUGIN = """import json, os, pytest

def pytest_runtest_setup(item):
  with open(os.environ["SAO_SCHEDULE_LOG"], "a") as f:
    f.write(json.dumps([os.environ.get("PYTEST_XDIST_WORKER", "main"), item.nodeid]) + "\\n")
  pytest.skip("scheduling only")
"""
OTHER = "tests/test_run_config.py"  # one-process test files: they must stay ungrouped
OTHER_2 = "tests/core/test_losses.py"


def test_scheduling_unit_groups_exactly_the_multiprocess_tests():
  assert conftest.scheduling_unit("tests/e2e/test_x.py::test_y[a]") == conftest.MULTIPROCESS_GROUP
  two_processes = "tests/train/test_coordination.py::test_two_jax_processes_with_different_plans_stop_with_both_named"
  assert conftest.scheduling_unit(two_processes) == conftest.MULTIPROCESS_GROUP
  in_process = "tests/train/test_coordination.py::test_bad_arguments_are_named"  # a file's in-process tests spread
  assert conftest.scheduling_unit(in_process) == in_process
  assert conftest.scheduling_unit(f"{OTHER}::test_w") == f"{OTHER}::test_w"


def test_multiprocess_tests_run_once_each_on_one_worker_under_the_suite_command(tmp_path):
  (tmp_path / "record_schedule.py").write_text(RECORD_PLUGIN)
  log = tmp_path / "schedule.jsonl"
  env = dict(os.environ, SAO_SCHEDULE_LOG=str(log),
             PYTHONPATH=os.pathsep.join([str(tmp_path), REPO, os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.run(
      [sys.executable, "-m", "pytest", *conftest.MULTIPROCESS_TESTS, OTHER, OTHER_2, "-q", "-n", "2", "--dist",
       "loadgroup", "-p", "record_schedule", "-p", "no:cacheprovider"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  runs = [tuple(json.loads(line)) for line in log.read_text().splitlines()]
  times_run = collections.Counter(nodeid for _, nodeid in runs)
  assert set(times_run.values()) == {1}, [n for n, c in times_run.items() if c > 1]  # nothing runs twice
  workers_of = collections.defaultdict(set)
  for worker, nodeid in runs:
    workers_of[conftest.scheduling_unit(nodeid) == conftest.MULTIPROCESS_GROUP].add(worker)
  assert workers_of[True] and len(workers_of[True]) == 1, workers_of  # one worker: never two at a time
  assert len(workers_of[False]) == 2, workers_of  # the rest is spread over both workers
  for prefix in conftest.MULTIPROCESS_TESTS:  # every multi-process file has tests that ran
    assert any(nodeid.startswith(prefix) for _, nodeid in runs), prefix
