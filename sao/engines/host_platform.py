"""Which JAX platform a process on this host should use, decided before JAX is imported.

With libtpu installed (the `test` extra brings it, for the ahead-of-time compile report) JAX tries the TPU backend
first on every host; on a machine without a TPU that prints pages of libtpu errors ("could not determine TPU
accelerator type") into every process's log before falling back to CPU. `pin_cpu_without_accelerator()` sets
`JAX_PLATFORMS=cpu` when the host exposes no TPU / GPU device files and the variable is unset; the entry points
(`experiments/train.py`, `python -m sao.engines.serve`) call it before importing JAX, and the processes they start
inherit it. A value the user set is never changed.
"""
from __future__ import annotations

import glob
import os
from typing import Mapping, MutableMapping

ENV = "JAX_PLATFORMS"
ACCELERATOR_DEVICE_GLOBS = ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*")


def has_accelerator(device_globs: tuple[str, ...] = ACCELERATOR_DEVICE_GLOBS) -> bool:
  """Whether this host exposes TPU (`/dev/accel*`, `/dev/vfio/<n>`) or GPU (`/dev/nvidia<n>`) device files."""
  return any(glob.glob(pattern) for pattern in device_globs)


def pin_cpu_without_accelerator(env: MutableMapping[str, str] | None = None,
                                device_globs: tuple[str, ...] = ACCELERATOR_DEVICE_GLOBS) -> bool:
  """Sets `JAX_PLATFORMS=cpu` in `env` (default: this process's environment) when it is unset and the host has no
  accelerator; returns whether it did."""
  env = os.environ if env is None else env
  if env.get(ENV) or has_accelerator(device_globs):
    return False
  env[ENV] = "cpu"
  return True


def runs_on_cpu(env: Mapping[str, str] | None = None,
                device_globs: tuple[str, ...] = ACCELERATOR_DEVICE_GLOBS) -> bool:
  """Whether JAX in a process with environment `env` (default: this one's) computes on XLA:CPU: `JAX_PLATFORMS`
  names cpu first, or it is unset and the host exposes no accelerator device files."""
  env = os.environ if env is None else env
  platforms = [p.strip() for p in env.get(ENV, "").split(",") if p.strip()]
  if platforms:
    return platforms[0] == "cpu"
  return not has_accelerator(device_globs)
