"""sao.engines.host_malloc: freed memory is reused instead of page-faulted in again; the opt-out and its errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sao.engines import host_malloc

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# In a fresh process (mallopt changes the whole process): 64 MiB buffers allocated, written and freed 10 times after
# one warm-up, the way XLA:CPU treats an update's temporaries, with their minor page faults counted.
_CHURN = r"""
import ctypes, json, resource
from sao.engines import host_malloc
applied = host_malloc.keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
def churn():  # plain malloc, as XLA's buffers (numpy's large arrays would ask for huge pages)
  p = libc.malloc(64 << 20)
  ctypes.memset(p, 1, 64 << 20)
  libc.free(p)
churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
  churn()
print(json.dumps({"applied": applied, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""
PAGES_PER_BUFFER = (64 << 20) // 4096


def _churn_faults(mode: str) -> dict:
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p))
  env[host_malloc.ENV] = mode
  out = subprocess.run([sys.executable, "-c", _CHURN], env=env, capture_output=True, text=True, timeout=120,
                       check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not host_malloc.supported(), reason="glibc's mallopt (Linux) only")
def test_freed_buffers_are_reused_without_page_faults():
  kept = _churn_faults(host_malloc.KEEP)
  assert kept["applied"]
  # glibc's defaults munmap each 64 MiB buffer on free: 10 × 16384 faults with 4 KiB pages. Kept: the warm-up's
  # pages are reused (what is left is the interpreter's own small allocations).
  assert kept["faults"] < PAGES_PER_BUFFER // 4, kept


@pytest.mark.skipif(not host_malloc.supported(), reason="glibc's mallopt (Linux) only")
def test_system_mode_leaves_glibc_alone():
  system = _churn_faults(host_malloc.SYSTEM)
  assert not system["applied"]
  assert system["faults"] > 0, system  # each buffer mapped afresh (fewer faults where pages are huge)


def test_mode_comes_from_the_environment_and_bad_values_name_the_variable():
  assert host_malloc.mode({}) == host_malloc.AUTO
  assert host_malloc.mode({host_malloc.ENV: " System "}) == host_malloc.SYSTEM
  with pytest.raises(ValueError, match="SAO_HOST_MALLOC='reuse'"):
    host_malloc.mode({host_malloc.ENV: "reuse"})
  assert host_malloc.keep_freed_memory({host_malloc.ENV: "system"}) is False


def test_auto_mode_keeps_glibc_defaults_on_accelerator_hosts(tmp_path, monkeypatch):
  from sao.engines import host_platform  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(host_platform, "has_accelerator", lambda *args: True)
  assert host_malloc.keep_freed_memory({host_malloc.ENV: "auto"}) is False


def test_cpu_is_pinned_only_without_an_accelerator_and_never_over_the_users_choice(tmp_path):
  from sao.engines import host_platform  # pylint: disable=g-import-not-at-top
  (tmp_path / "accel0").touch()
  tpu, none = (str(tmp_path / "accel*"),), (str(tmp_path / "nvidia[0-9]*"),)
  assert host_platform.has_accelerator(tpu) and not host_platform.has_accelerator(none)
  env = {}
  assert host_platform.pin_cpu_without_accelerator(env, none) and env == {"JAX_PLATFORMS": "cpu"}
  env = {}
  assert not host_platform.pin_cpu_without_accelerator(env, tpu) and env == {}
  env = {"JAX_PLATFORMS": "tpu,cpu"}
  assert not host_platform.pin_cpu_without_accelerator(env, none) and env == {"JAX_PLATFORMS": "tpu,cpu"}
