"""Test-wide setup: 8 fake CPU devices, set before jax is imported anywhere."""
import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (must come after XLA_FLAGS)

jax.config.update("jax_threefry_partitionable", True)


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: a test that takes more than ~30 s on 2 CPU cores (still run in CI)")
