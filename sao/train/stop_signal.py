"""SIGTERM for a trainer process: stop at the next step boundary, with a checkpoint, or exit if the process is stuck.

`StopSignal.install(grace_s, describe)` replaces the default action of SIGTERM (and of JAX's distributed runtime,
whose preemption notifier takes SIGTERM once `jax.distributed.initialize` ran and otherwise leaves the process
running: a 2-process job ignored `kill` and needed SIGKILL). After it, SIGTERM sets `requested`; the trainer reads it
at each step boundary, agrees with the other processes (a stop any process was asked for is every process's,
`sao.train.coordination.KeyValueChannel.agree`), saves a checkpoint where the phase has one and raises
`StopRequested`.

A Python signal handler only runs between bytecodes of the main thread, and a main thread blocked inside a
computation or a collective never gets there. The C-level handler still writes the signal number to the wakeup file
descriptor (`signal.set_wakeup_fd`) at once; a watcher thread reads it and, if the process is still running
`grace_s` later, prints what `describe()` says the process was doing and ends it with exit code 128 + SIGTERM.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable

EXIT_SIGTERM = 128 + signal.SIGTERM


class StopRequested(RuntimeError):
  """The run stopped at a step boundary because a process received SIGTERM (after its checkpoint, if one was due)."""


class StopSignal:
  """Whether a stop was asked for (`requested`); see the module docstring. `StopSignal()` alone never fires."""

  def __init__(self):
    self._event = threading.Event()
    self._exited = threading.Event()
    self._restore: Callable[[], None] | None = None

  @property
  def requested(self) -> bool:
    return self._event.is_set()

  def request(self) -> None:
    self._event.set()

  @classmethod
  def install(cls, grace_s: float, describe: Callable[[], str] = lambda: "") -> "StopSignal":
    """Takes SIGTERM for this process: `requested` becomes true, and a process still running `grace_s` after the
    signal exits with `EXIT_SIGTERM`, naming what it was doing. Off the main thread (Python takes signals there
    only) it returns a `StopSignal` that never fires. `exited()` gives SIGTERM back."""
    stop = cls()
    if threading.current_thread() is not threading.main_thread():
      return stop
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous_handler = signal.signal(signal.SIGTERM, lambda signum, frame: stop.request())
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watch():
      while True:
        data = os.read(read_fd, 64)
        if not data or stop._exited.is_set():  # pylint: disable=protected-access
          break
        if signal.SIGTERM not in data:
          continue  # another signal Python handles (SIGINT): not ours
        stop.request()
        print(f"[trainer] SIGTERM: stopping at the next step boundary (within {grace_s:g} s)", file=sys.stderr,
              flush=True)
        if not stop._exited.wait(grace_s):  # pylint: disable=protected-access
          print(f"[trainer] SIGTERM: still running after {grace_s:g} s ({describe() or 'no phase recorded'}): "
                f"exiting with code {EXIT_SIGTERM}", file=sys.stderr, flush=True)
          os._exit(EXIT_SIGTERM)  # pylint: disable=protected-access
        break
      os.close(read_fd)

    def restore():
      signal.set_wakeup_fd(previous_fd)
      signal.signal(signal.SIGTERM, previous_handler)
      os.close(write_fd)  # the watcher reads end-of-file and ends

    stop._restore = restore  # pylint: disable=protected-access
    threading.Thread(target=watch, name="sigterm-watcher", daemon=True).start()
    return stop

  def exited(self) -> None:
    """The run is ending by itself: the watcher no longer ends the process, and SIGTERM's previous handling is back
    (when called on the main thread, as `install`)."""
    self._exited.set()
    restore, self._restore = self._restore, None
    if restore is not None and threading.current_thread() is threading.main_thread():
      restore()
