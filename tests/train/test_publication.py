"""`sao.train.publication`: versions reach the service and the engines in order, one at a time, in the background;
a failed publish is raised at the next call; old exports are removed once a newer version is served."""
import logging
import os
import threading

import pytest

from sao.engines.fleet import FleetError
from sao.train.publication import Publication


class Recorder:
  """A trajectory service and a fleet that record every call in order."""

  def __init__(self, gates: dict[int, threading.Event] | None = None, fail: int | None = None):
    self.events: list[tuple[str, int]] = []
    self.lock = threading.Lock()
    self.gates = gates or {}
    self.fail = fail
    self.publish_threads: set[str] = set()

  def _record(self, what: str, version: int) -> None:
    with self.lock:
      self.events.append((what, version))

  def announce_policy_version(self, version: int) -> None:
    self._record("announce", version)

  def set_policy_version(self, version: int) -> None:
    self._record("serve", version)

  def publish(self, path: str, version: int) -> dict[str, float]:
    self.publish_threads.add(threading.current_thread().name)
    self._record("publish_begin", version)
    if version in self.gates:
      assert self.gates[version].wait(timeout=10.0)
    if version == self.fail:
      raise FleetError(f"no server reached weight version {version}")
    self._record("publish_end", version)
    return {"fleet/servers_current": 1.0, "version": float(version)}


def _exports(tmp_path, versions):
  for v in versions:
    os.makedirs(tmp_path / f"v{v}")
  return lambda v: str(tmp_path / f"v{v}")


def test_background_publishes_run_in_order_one_at_a_time(tmp_path):
  path = _exports(tmp_path, [1, 2, 3])
  gate = threading.Event()
  rec = Recorder(gates={1: gate})
  pub = Publication(rec.publish, rec, keep=3)
  assert pub.start(path(1), 1) == {}  # nothing before it
  # While version 1's publish is held, the caller goes on (start returned); the next start must wait for it.
  threading.Timer(0.2, gate.set).start()
  previous = pub.start(path(2), 2)
  assert previous["version"] == 1.0 and previous["fleet/servers_current"] == 1.0
  assert previous["fleet/published_version"] == 1.0
  assert previous["fleet/publish_s"] >= 0.1 and previous["trainer/publish_wait_s"] >= 0.1
  last = pub.wait()
  assert last["version"] == 2.0 and last["fleet/published_version"] == 2.0
  assert pub.wait() == {}  # nothing in flight any more
  assert rec.events == [("announce", 1), ("publish_begin", 1), ("publish_end", 1), ("serve", 1),
                        ("announce", 2), ("publish_begin", 2), ("publish_end", 2), ("serve", 2)]
  assert rec.publish_threads and all(name.startswith("sao-publish") for name in rec.publish_threads)
  pub.close()


def test_synchronous_mode_serves_before_start_returns(tmp_path):
  path = _exports(tmp_path, [1])
  rec = Recorder()
  pub = Publication(rec.publish, rec, keep=3, background=False)
  metrics = pub.start(path(1), 1)
  assert metrics["version"] == 1.0 and metrics["trainer/publish_wait_s"] == 0.0 and "fleet/publish_s" in metrics
  assert rec.events[-1] == ("serve", 1)
  assert rec.publish_threads == {threading.current_thread().name}
  assert pub.wait() == {}
  pub.close()


def test_a_failed_publish_raises_at_the_next_call_and_is_never_served(tmp_path):
  path = _exports(tmp_path, [1, 2])
  rec = Recorder(fail=1)
  pub = Publication(rec.publish, rec, keep=3)
  pub.start(path(1), 1)
  with pytest.raises(FleetError, match="version 1"):
    pub.start(path(2), 2)
  assert ("serve", 1) not in rec.events and ("announce", 2) not in rec.events  # version 2 was never started
  pub.close()


def test_a_failure_in_flight_at_close_is_logged_not_raised(tmp_path, caplog):
  path = _exports(tmp_path, [1])
  rec = Recorder(fail=1)
  pub = Publication(rec.publish, rec, keep=3)
  pub.start(path(1), 1)
  with caplog.at_level(logging.ERROR, logger="sao.train.publication"):
    pub.close()
  assert "failed" in caplog.text and "version 1" in caplog.text


def test_old_exports_are_removed_once_a_newer_version_is_served(tmp_path):
  path = _exports(tmp_path, [1, 2, 3, 4])
  rec = Recorder()
  pub = Publication(rec.publish, None, keep=2)  # no service: only the fleet is told
  for v in (3, 4):
    pub.start(path(v), v)
    pub.wait()
  assert sorted(os.listdir(tmp_path)) == ["v3", "v4"]  # v1 went with v3, v2 with v4
  assert ("announce", 3) not in rec.events
  pub.close()
