"""The suite's pytest-xdist grouping (`tests/conftest.py`): under the README's `-n 2 --dist loadgroup` every test of
`MULTIPROCESS_TESTS` carries the `multiprocess` group in its node id (so they run one at a time, on one worker, and a
module's fixture is set up once), and no other test does.

pytest-xdist turns an `xdist_group` marker into that node-id suffix in its own collection hook: a marker added after
it is silently ignored, and the tests then run ungrouped (until session 29 the multi-host learner's module fixture,
three 2-process jobs, ran twice per suite). Here a subprocess runs the suite's command on those files with one
worker and a plugin that skips every test at setup, so only collection and scheduling happen.
"""
import os
import re
import subprocess
import sys

from tests import conftest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_PLUGIN = "import pytest\n\ndef pytest_runtest_setup(item):\n  pytest.skip('scheduling only')\n"
OTHER = "tests/test_run_config.py"  # a one-process test file: must stay ungrouped


def test_multiprocess_tests_and_only_they_are_grouped_under_loadgroup(tmp_path):
  (tmp_path / "skip_every_test.py").write_text(SKIP_PLUGIN)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO, os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.run(
      [sys.executable, "-m", "pytest", *conftest.MULTIPROCESS_TESTS, OTHER, "-n", "1", "--dist", "loadgroup", "-v",
       "-p", "skip_every_test", "-p", "no:cacheprovider"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  ids = set(re.findall(r"SKIPPED (\S+::\S+)", proc.stdout))
  grouped = {i for i in ids if i.endswith("@multiprocess")}
  others = ids - grouped
  assert grouped and others, proc.stdout[-3000:]
  assert all(i.startswith(conftest.MULTIPROCESS_TESTS) for i in grouped), sorted(grouped)
  assert all(i.startswith(OTHER) for i in others), sorted(others)  # every multi-process test is grouped
  # Every file named in MULTIPROCESS_TESTS has grouped tests.
  for prefix in conftest.MULTIPROCESS_TESTS:
    assert any(i.startswith(prefix) for i in grouped), prefix
