"""Ending a sandboxed command: its whole session, and every process that still holds its output pipe."""
from __future__ import annotations

import asyncio
import glob
import os
import signal


def kill_pipe_holders(inode: int, rounds: int = 10) -> None:
  """SIGKILLs every process (but this one) holding pipe `inode`; repeated, as a holder may fork meanwhile."""
  target, me = f"pipe:[{inode}]", str(os.getpid())
  for _ in range(rounds):
    holders = set()
    for fd_dir in glob.glob("/proc/[0-9]*/fd"):
      pid = fd_dir.split("/")[2]
      if pid == me:
        continue
      try:
        if any(os.readlink(os.path.join(fd_dir, fd)) == target for fd in os.listdir(fd_dir)):
          holders.add(int(pid))
      except OSError:
        continue  # exited meanwhile, or not ours to inspect
    if not holders:
      return
    for pid in holders:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass


def kill_session(proc: asyncio.subprocess.Process) -> None:
  """SIGKILLs the command's session (bwrap and, via its PID namespace, everything the command started)."""
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass  # already exited
