"""sao.engines.fleet and sao.engines.router against the real `sglang-router` (a subprocess) in front of fake SGLang
servers (tests/engines/fleet_helpers.py): every server gets each published version, a server that refuses, lags or
dies is taken out of the router's rotation and put back once it is current, and requests reach only servers in it.

sglang-router is in the test extra; without it these tests fail (never skip) with the install command."""
from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request

import pytest

from sao.engines import fleet as fleet_lib
from sao.engines import router as router_lib
from sao.engines.sglang_client import SGLangEngine
from tests.engines.fleet_helpers import FakeServer
from tests.engines.test_lifetime import _alive

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def servers():
  started = [FakeServer(), FakeServer()]
  yield started
  for s in started:
    s.stop()


@pytest.fixture
def router(servers, tmp_path):
  handle = router_lib.start_router([s.url for s in servers], log_path=str(tmp_path / "router.log"),
                                   policy="round_robin")
  yield handle
  handle.stop()


def _rotation(router) -> set[str]:
  return set(asyncio.run(_workers(router.url)))


async def _workers(url):
  async with router_lib.RouterAdmin(url) as admin:
    return await admin.workers()


def _generate_versions(url: str, n: int) -> list[str]:
  """`n` /generate requests through `url`, one at a time: the weight_version each response reports."""
  async def main():
    async with SGLangEngine(url, timeout_s=30) as engine:
      return [(await engine.generate([1, 2, 3], {"max_new_tokens": 2})).weight_version for _ in range(n)]
  return asyncio.run(main())


def test_the_router_does_not_forward_weight_updates(router):
  request = urllib.request.Request(router.url + "/update_weights_from_disk", method="POST", data=b"{}",
                                   headers={"Content-Type": "application/json"})
  with pytest.raises(urllib.error.HTTPError) as e:
    urllib.request.urlopen(request, timeout=10)
  assert e.value.code == 404


def test_publish_reaches_every_server_behind_the_router(servers, router):
  fleet = fleet_lib.Fleet([router.url])
  for version in (1, 2):
    report = asyncio.run(fleet.publish(f"/policy/v{version}", version))
    assert [s.updates[-1] for s in servers] == [(f"/policy/v{version}", str(version))] * 2
    assert {s.url: (s.version, s.in_rotation, s.router) for s in report.servers} == \
        {s.url: (str(version), True, router.url) for s in servers}
  metrics = report.metrics()
  assert metrics["fleet/servers"] == 2 and metrics["fleet/servers_current"] == 2
  assert metrics["fleet/servers_in_rotation"] == 2
  for s in servers:
    assert metrics[f"fleet/weight_version/127.0.0.1:{s.port}"] == 2.0
    assert metrics[f"fleet/in_rotation/127.0.0.1:{s.port}"] == 1.0
  assert collections.Counter(_generate_versions(router.url, 4)) == {"2": 4}
  assert all(s.served for s in servers)  # round robin: both serve


@pytest.mark.parametrize("fault", ["refuse", "lag"])
def test_a_server_that_is_not_current_leaves_the_rotation_until_it_catches_up(servers, router, fault):
  good, bad = servers
  fleet = fleet_lib.Fleet([router.url])
  asyncio.run(fleet.publish("/policy/v1", 1))
  setattr(bad, fault, True)
  report = asyncio.run(fleet.publish("/policy/v2", 2))
  by_url = {s.url: s for s in report.servers}
  assert (by_url[good.url].version, by_url[good.url].in_rotation) == ("2", True)
  assert (by_url[bad.url].version, by_url[bad.url].in_rotation) == ("1", False)
  assert ("refused" in by_url[bad.url].error) if fault == "refuse" else ("reports weight_version '1'" in
                                                                        by_url[bad.url].error)
  assert report.metrics()[f"fleet/weight_version/127.0.0.1:{bad.port}"] == 1.0
  assert _rotation(router) == {good.url}
  served_before = bad.served
  assert _generate_versions(router.url, 6) == ["2"] * 6  # nothing reaches the lagging server
  assert bad.served == served_before
  # Still failing at the next publish: still out (and retried).
  report = asyncio.run(fleet.publish("/policy/v3", 3))
  assert _rotation(router) == {good.url} and len(bad.updates) == 3
  # It catches up at the publish after: back in the rotation, serving the current version.
  setattr(bad, fault, False)
  report = asyncio.run(fleet.publish("/policy/v4", 4))
  assert all((s.version, s.in_rotation) == ("4", True) for s in report.servers)
  assert _rotation(router) == {good.url, bad.url}
  assert _generate_versions(router.url, 4) == ["4"] * 4 and bad.served > served_before


def test_a_dead_server_is_taken_out_and_requests_go_to_the_others(servers, router):
  alive, dead = servers
  fleet = fleet_lib.Fleet([router.url], max_retries=0)
  dead.stop()
  report = asyncio.run(fleet.publish("/policy/v1", 1))
  by_url = {s.url: s for s in report.servers}
  assert by_url[dead.url].version is None and not by_url[dead.url].in_rotation and by_url[dead.url].error
  assert report.metrics()[f"fleet/weight_version/127.0.0.1:{dead.port}"] == -1.0
  assert _rotation(router) == {alive.url}
  assert _generate_versions(router.url, 3) == ["1"] * 3


def test_no_current_server_is_an_error_and_the_rotation_is_kept(servers, router):
  for s in servers:
    s.refuse = True
  with pytest.raises(fleet_lib.FleetError, match=r"no server reached weight version 1 .*refused \(test\)"):
    asyncio.run(fleet_lib.Fleet([router.url]).publish("/policy/v1", 1))
  assert _rotation(router) == {s.url for s in servers}


def test_servers_named_directly_are_each_updated(servers):
  report = asyncio.run(fleet_lib.Fleet([s.url for s in servers]).publish("/p", 5))
  assert [(s.version, s.router) for s in report.servers] == [("5", ""), ("5", "")]
  assert [s.version for s in servers] == ["5", "5"]


def test_a_request_in_flight_on_a_removed_server_completes_with_its_version(servers, router):
  slow, other = servers
  slow.generate_delay_s = 1.5

  async def main():
    async with SGLangEngine(router.url, timeout_s=30) as engine, router_lib.RouterAdmin(router.url) as admin:
      requests = [asyncio.create_task(engine.generate([1, 2], {"max_new_tokens": 2})) for _ in range(2)]
      while slow.generate_delay_s and not any(t.done() for t in requests):
        await asyncio.sleep(0.05)  # the fast server answered: the other request is on the slow one
      await admin.remove(slow.url)
      slow.version = "9"  # what it would report for a request started now
      return [await t for t in requests], await admin.workers()

  results, rotation = asyncio.run(main())
  assert sorted(r.weight_version for r in results) == ["0", "0"] and set(rotation) == {other.url}


def test_start_router_names_the_test_extra_when_sglang_router_is_missing(monkeypatch):
  monkeypatch.setattr(router_lib.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(ImportError, match=r'pip install -e "\.\[test\]"'):
    router_lib.start_router(["http://127.0.0.1:9"])


def test_router_argv_and_bad_arguments():
  argv = router_lib.router_argv(["http://a:1", "http://b:2"], 30080, policy="round_robin", prometheus_port=29001,
                                python="py")
  assert argv[:3] == ["py", "-m", "sao.engines.router"]
  assert argv[argv.index("--worker-urls") + 1:argv.index("--host")] == ["http://a:1", "http://b:2"]
  assert argv[argv.index("--port") + 1] == "30080" and argv[argv.index("--prometheus-port") + 1] == "29001"
  with pytest.raises(ValueError, match="policy"):
    router_lib.router_argv(["http://a:1"], 1, policy="fastest", prometheus_port=2)
  with pytest.raises(ValueError, match="worker_urls"):
    router_lib.router_argv([], 1, prometheus_port=2)
  with pytest.raises(ValueError, match="engine_urls"):
    fleet_lib.Fleet([])
  assert json.loads(json.dumps(fleet_lib.metric_name("http://10.0.0.3:30001/"))) == "10.0.0.3:30001"


_LAUNCHER = textwrap.dedent("""
    import time
    from sao.engines import router as router_lib
    from tests.engines.fleet_helpers import FakeServer
    server = FakeServer()
    router = router_lib.start_router([server.url])
    print(router.pid, flush=True)
    time.sleep(120)
""")


def test_the_router_ends_with_its_launcher():
  launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER], stdout=subprocess.PIPE, text=True, cwd=REPO,
                              env=dict(os.environ, PYTHONPATH=REPO))
  try:
    router_pid = int(launcher.stdout.readline())
    assert _alive(router_pid)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(timeout=10)
    deadline = time.monotonic() + 20
    while _alive(router_pid) and time.monotonic() < deadline:
      time.sleep(0.1)
    assert not _alive(router_pid), "the router outlived its SIGKILLed launcher"
  finally:
    launcher.kill()
    launcher.wait()


def test_a_router_that_went_away_does_not_stop_the_publish(servers, router):
  good, bad = servers
  fleet = fleet_lib.Fleet([router.url], max_retries=0)
  asyncio.run(fleet.publish("/policy/v1", 1))
  router.stop()
  bad.refuse = True
  report = asyncio.run(fleet.publish("/policy/v2", 2))  # the servers it knows are still updated, directly
  by_url = {s.url: s for s in report.servers}
  assert set(by_url) == {good.url, bad.url}  # the router's own URL is not taken for a server
  assert by_url[good.url].version == "2" and by_url[bad.url].version == "1"
  assert "refused" in by_url[bad.url].error and f"router {router.url}" in by_url[bad.url].error
  assert by_url[bad.url].in_rotation  # it could not be taken out: the report does not pretend it was
