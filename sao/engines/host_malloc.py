"""glibc malloc settings for processes that run XLA:CPU programs: freed memory is kept for reuse, not handed back.

XLA:CPU allocates each execution's buffers with `malloc`: one update of the toy's learner asks for temporaries of
35–290 MB. glibc serves every request above its mmap threshold (32 MiB at most) with a fresh `mmap` and `munmap`s
it on `free`, and a thread's arena (64 MiB heaps) does the same for anything bigger; so every update page-faults
its whole working set in again, and the kernel zeroes each 4 KiB page first. In the README's job shortened to 40
steps that was most of the trainer's kernel time: 10 M minor page faults in its XLA threads, a third of their CPU
time (docs/performance_job.md, "Host memory: freed memory kept for reuse").

`keep_freed_memory()` sets, with `mallopt` (Linux with glibc only; elsewhere it does nothing):
- `M_MMAP_MAX = 0`: no chunk is `mmap`ed; requests come from the heap;
- `M_ARENA_MAX = 1`: one arena, the main one, which grows with `brk` without a size limit (a thread arena cannot
  hold a request over 64 MiB and would fall back to `mmap`). Called before the process starts its threads, so that
  XLA's thread pools use that arena too;
- `M_TRIM_THRESHOLD` = 2 GiB: free memory at the top of the heap stays mapped.

The price: the resident memory stays at its peak (the next update needs that much again anyway), and the heap holds
somewhat more than the mmapped chunks did (toy learner updates: peak 1179 → 1492 MiB).
`SAO_HOST_MALLOC` chooses (inherited by the children a launcher starts): `auto` (the default) keeps freed memory on
a host without accelerator device files and leaves glibc's defaults on a TPU / GPU host (`/dev/accel*`,
`/dev/vfio/<n>`, `/dev/nvidia<n>`), where XLA's buffers live on the device and host memory (streamed checkpoints,
trajectory batches) should go back to the system; `keep` forces the settings, `system` never applies them.
"""
from __future__ import annotations

import ctypes
import platform
import sys

from sao import env_choice
from sao.engines import host_platform

ENV = "SAO_HOST_MALLOC"
AUTO, KEEP, SYSTEM = "auto", "keep", "system"

# glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8
TRIM_THRESHOLD_BYTES = 2**31 - 1  # mallopt's value is an int: 2 GiB, far above any one free here


_MEANINGS = {AUTO: "keep freed memory for reuse unless the host has an accelerator", KEEP: "always",
             SYSTEM: "glibc's own malloc settings"}


def mode(env: dict[str, str] | None = None) -> str:
  """`auto` (the default), `keep` or `system`, from `SAO_HOST_MALLOC`; ValueError naming the variable otherwise."""
  return env_choice.read(ENV, _MEANINGS, AUTO, env)


def supported() -> bool:
  """Whether this process's C library is glibc on Linux (the only one whose `mallopt` this module speaks)."""
  return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def keep_freed_memory(env: dict[str, str] | None = None) -> bool:
  """Applies the settings of the module docstring as `SAO_HOST_MALLOC` says; returns whether it did.
  OSError naming the option if glibc refuses one."""
  chosen = mode(env)
  if chosen == SYSTEM or not supported() or (chosen == AUTO and host_platform.has_accelerator()):
    return False
  mallopt = ctypes.CDLL(None).mallopt
  mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
  for name, option, value in (("M_MMAP_MAX", M_MMAP_MAX, 0), ("M_ARENA_MAX", M_ARENA_MAX, 1),
                              ("M_TRIM_THRESHOLD", M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)):
    if mallopt(option, value) != 1:
      raise OSError(f"glibc mallopt({name}, {value}) failed")
  return True
