"""Child processes that end with the process that started them (Linux `PR_SET_PDEATHSIG`).

A launcher (`sao.engines.processes.ChildProcess`, `start_local_engine`) starts engines and rollout workers as
subprocesses with `child_env()`; each child calls `exit_with_parent()` first thing, which asks the kernel for SIGTERM
when its parent dies — so killing the launcher alone (even with SIGKILL) does not leave orphaned engines and workers
behind. The request is made in the child after exec (not in a `preexec_fn`, which is unsafe in a threaded parent).

The kernel ties the signal to the parent *thread* that forked the child, so launchers spawn from their main thread.
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from typing import Mapping

PARENT_PID_ENV = "SAO_PARENT_PID"
_PR_SET_PDEATHSIG = 1

log = logging.getLogger(__name__)


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
  """`env` (default: this process's environment) plus this process's pid as the child's parent to follow."""
  out = dict(os.environ if env is None else env)
  out[PARENT_PID_ENV] = str(os.getpid())
  return out


def exit_with_parent() -> bool:
  """If started with `child_env`, arranges SIGTERM on the parent's death; exits now if it already died.

  Returns whether the request was made (False: not started by a launcher, or not Linux)."""
  parent = os.environ.get(PARENT_PID_ENV)
  if not parent or not sys.platform.startswith("linux"):
    return False
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
      raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
  except (OSError, AttributeError) as e:
    log.warning("cannot follow the parent process %s (%s); this process outlives it if it is killed", parent, e)
    return False
  if os.getppid() != int(parent):  # the parent died before the request: the signal will never come
    log.error("parent process %s is gone; exiting", parent)
    sys.exit(1)
  return True
