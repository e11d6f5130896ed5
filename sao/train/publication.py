"""Policy versions to the engines in the background: the trainer's next update runs while the fleet loads the last.

Telling the engines about a new version (`sao.engines.fleet.Fleet.publish`: each server loads the exported directory,
waits for its running batch, swaps, and reports its version) takes the trainer nothing but waiting, with nothing queued
for its accelerators: a fifth of the main thread's time on the README's toy job, tens of seconds per step for a
70 GB policy published through disk (docs/performance.md, "Weight publication"; 2026-12-03, commit 11178cb). A
`Publication` runs
it in one background thread instead, one version at a time and in order:

    publication.start(path, version)   # waits for the previous version's publish (re-raising its error), then
                                       # announces `version` to the trajectory service and starts its publish
    ...                                 # the next step's batch and update run meanwhile
    publication.wait()                  # before the phase ends, a resume or a checkpoint of the fleet's state

Versions keep their order: version v+1's publish starts only after v's has finished, and the service hears
`announce_policy_version(v)` before any engine is told to load v and `set_policy_version(v)` only once one serves it
(what the synchronous publish did). What changes is when: engines serve v one publish later in the trainer's time
(the trainer has started the next update), so a trajectory may be up to that much older; the service's staleness
limit (`server.max_staleness`) still applies to every batch. A publish that fails (`FleetError`: no server reached the
version) raises at the next `start` or `wait`: the trainer stops one step later than it would have, never silently.

Metrics, returned by `start` and `wait` for the publish they waited for: the fleet's own (`fleet/*`, every server's
reported version), `fleet/published_version` (the version they report on: in the background, a step's row carries
the previous version's publish), `fleet/publish_s` (that publish's wall time) and `trainer/publish_wait_s` (how long
the trainer waited for it: 0 when it had finished during the update).
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import shutil
import time
from typing import Any, Callable

log = logging.getLogger(__name__)


class Publication:
  """Publishes policy versions one at a time in a background thread (module docstring).

  `publish(path, version) -> metrics`: the fleet call (blocking; run in the background thread);
  `server`: the trajectory service (`announce_policy_version`, `set_policy_version`), or None;
  `keep`: exports kept on disk (`<dir>/v<version - keep>` is removed once `version` is served);
  `background`: False runs every publish in `start` itself (the synchronous behaviour)."""

  def __init__(self, publish: Callable[[str, int], dict[str, float]], server: Any | None, keep: int,
               background: bool = True):
    self._publish = publish
    self._server = server
    self._keep = keep
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sao-publish") if background else None
    self._pending: concurrent.futures.Future | None = None

  def start(self, path: str, version: int) -> dict[str, float]:
    """Starts publishing `path` as `version` after the previous publish has finished; returns that previous
    publish's metrics (empty if there was none). Synchronous mode: publishes now and returns this one's metrics."""
    metrics = self.wait()
    if self._server is not None:
      self._server.announce_policy_version(version)  # before the engines serve it: their trajectories are not "future"
    if self._pool is None:
      return {**metrics, **self._run(path, version), "trainer/publish_wait_s": 0.0}
    self._pending = self._pool.submit(self._run, path, version)
    return metrics

  def wait(self) -> dict[str, float]:
    """Waits for the publish in flight (re-raising its error); its metrics, or {} if none was in flight."""
    if self._pending is None:
      return {}
    pending, self._pending = self._pending, None
    start = time.perf_counter()
    metrics = pending.result()
    return {**metrics, "trainer/publish_wait_s": time.perf_counter() - start}

  def close(self) -> None:
    """Stops the thread after the publish in flight. Its error, if any, is logged, not raised: `close` runs on the
    way out of a run, where a raise would hide the error that ended it; a run that ends well `wait`s first."""
    if self._pool is not None:
      self._pool.shutdown(wait=True)
    if self._pending is not None and self._pending.exception() is not None:
      log.error("publication: the publish in flight when the run stopped failed: %r", self._pending.exception())
    self._pending = None

  def _run(self, path: str, version: int) -> dict[str, float]:
    start = time.perf_counter()
    metrics = dict(self._publish(path, version))
    if self._server is not None:
      self._server.set_policy_version(version)
    old = os.path.join(os.path.dirname(path), f"v{version - self._keep}")
    shutil.rmtree(old, ignore_errors=True)
    metrics["fleet/publish_s"] = time.perf_counter() - start
    metrics["fleet/published_version"] = float(version)  # which version these fleet metrics report on
    return metrics
