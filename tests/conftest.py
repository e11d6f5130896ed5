"""Test-wide setup: 8 fake CPU devices, set before jax is imported anywhere."""
import atexit
import os
import shutil
import tempfile

import pytest

# LLVM at -O0 for the tests' programs: XLA's HLO passes (fusion, layout, buffer assignment: what the memory and HLO
# tests read) are unchanged, and the suite's programs are small enough that compiling them is most of their cost
# (docs/performance.md, "The test suite"). The subprocesses the tests start inherit both flags.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The runs the tests start share one compilation cache (sao.engines.compilation_cache), this session's, never the
# user's: a test run neither reads nor fills ~/.cache/sao.
os.environ["SAO_CACHE_DIR"] = tempfile.mkdtemp(prefix="sao_test_cache_")
atexit.register(shutil.rmtree, os.environ["SAO_CACHE_DIR"], True)

import jax  # noqa: E402  (must come after XLA_FLAGS)

jax.config.update("jax_threefry_partitionable", True)


# Tests that start several busy processes at once (a trainer job, engines, workers, JAX process groups): under
# pytest-xdist they run one at a time on one worker (`--dist loadgroup`), beside the rest of the suite on the others.
MULTIPROCESS_TESTS = ("tests/e2e/", "tests/train/test_multihost_learner.py", "tests/train/test_coordination.py",
                      "tests/train/test_multihost_export.py")


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: a test that takes more than ~30 s on 2 CPU cores (still run in CI)")


# First among the plugins' hooks: pytest-xdist's own (`--dist loadgroup`) turns the `xdist_group` marker into the
# node-id suffix that groups the tests, and it only sees markers added before it runs.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
  del config
  for item in items:
    if item.nodeid.startswith(MULTIPROCESS_TESTS):  # node ids are relative to the repository root (pytest.ini)
      item.add_marker(pytest.mark.xdist_group("multiprocess"))
