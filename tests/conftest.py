"""Test-wide setup: 8 fake CPU devices, set before jax is imported anywhere."""
import atexit
import os
import shutil
import tempfile

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The runs the tests start share one compilation cache (sao.engines.compilation_cache), this session's, never the
# user's: a test run neither reads nor fills ~/.cache/sao.
os.environ["SAO_CACHE_DIR"] = tempfile.mkdtemp(prefix="sao_test_cache_")
atexit.register(shutil.rmtree, os.environ["SAO_CACHE_DIR"], True)

import jax  # noqa: E402  (must come after XLA_FLAGS)

jax.config.update("jax_threefry_partitionable", True)


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: a test that takes more than ~30 s on 2 CPU cores (still run in CI)")
