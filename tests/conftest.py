"""Test-wide setup: 8 fake CPU devices, set before jax is imported anywhere."""
import atexit
import os
import shutil
import tempfile

import pytest

# LLVM at -O0 for the tests' programs: XLA's HLO passes (fusion, layout, buffer assignment: what the memory and HLO
# tests read) are unchanged, and the suite's programs are small enough that compiling them is most of their cost
# (docs/performance_tests.md). The subprocesses the tests start inherit both flags.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The runs the tests start share one compilation cache (sao.engines.compilation_cache), this pytest run's, never the
# user's: a test run neither reads nor fills ~/.cache/sao.
os.environ["SAO_CACHE_DIR"] = tempfile.mkdtemp(prefix="sao_test_cache_")
atexit.register(shutil.rmtree, os.environ["SAO_CACHE_DIR"], True)

import jax  # noqa: E402  (must come after XLA_FLAGS)

jax.config.update("jax_threefry_partitionable", True)


# Tests that start several busy processes at once (a trainer job, engines, workers, JAX process groups): under
# pytest-xdist they run one at a time, each once, on one worker (`--dist loadgroup`), beside the rest of the suite on
# the others. The grouping is this file's own scheduler (below), decided from the node id's path: pytest-xdist's
# `xdist_group` marker works by rewriting node ids, which pytest 9.2 no longer lets it do (pytest-xdist issue 1386):
# the marked tests were silently spread over both workers.
# Node-id prefixes of the tests that start processes of their own (whole files, or single tests of a file whose other
# tests run in-process and spread like any other).
MULTIPROCESS_TESTS = ("tests/e2e/", "tests/train/test_multihost_learner.py", "tests/train/test_cpu_cache_keys.py",
                      "tests/train/test_multihost_offpolicy.py",
                      "tests/train/test_coordination.py::test_two_jax_processes_share_messages_and_name_a_frozen_process",
                      "tests/train/test_coordination.py::test_two_jax_processes_with_different_plans_stop_with_both_named")
MULTIPROCESS_GROUP = "multiprocess"


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: a test that takes more than ~30 s on 2 CPU cores (still run in CI)")


def scheduling_unit(nodeid):
  """The scheduling unit of a node id under `--dist loadgroup`: `MULTIPROCESS_GROUP` for every multi-process test
  (node ids are relative to the repository root, pytest.ini; a `@group` suffix older pytest-xdist adds is ignored),
  the node id itself (a unit of one test) for every other."""
  return MULTIPROCESS_GROUP if nodeid.startswith(MULTIPROCESS_TESTS) else nodeid


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
  """`--dist loadgroup` with the units of `scheduling_unit` (pytest-xdist's load-scope scheduler: a unit never splits
  across workers and runs once)."""
  if config.getvalue("dist") != "loadgroup":
    return None
  from xdist.scheduler import LoadScopeScheduling  # pylint: disable=import-outside-toplevel

  class MultiprocessGroupScheduling(LoadScopeScheduling):

    def _split_scope(self, nodeid):
      return scheduling_unit(nodeid)

  return MultiprocessGroupScheduling(config, log)
