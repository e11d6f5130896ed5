"""New weights to every server of the fleet, whether the run's engine URLs name servers or `sglang-router`s.

    fleet = Fleet(["http://router:30080"])          # or server URLs, or both
    report = await fleet.publish("/runs/x/policy/v3", 3)
    report.metrics()    # fleet/servers_current, fleet/weight_version/<host:port>, fleet/in_rotation/<host:port>, ...

A router does not forward `/update_weights_from_disk` (it answers 404), so `publish` first learns the servers
behind each engine URL (`GET /workers` on a router; a URL that answers 404 there is a server itself) and remembers
every server it has seen, including those it took out of a rotation. Then, for every server at once:

  1. `POST /update_weights_from_disk {"model_path", "weight_version": str(version)}`;
  2. `GET /get_model_info`: the server's own `weight_version` is what counts (an update that said "success" but left
     the server on another version is a lagging server, as is one that refused or could not be reached);
  3. behind a router: a server not at `version` is taken out of the router's rotation (no new request goes to it),
     and a server that is at `version` but out of the rotation (it lagged at an earlier publish and caught up now)
     is put back. Every later publish retries the servers that are out.

At least one server must reach `version` (else `FleetError` naming each server's failure: the trainer stops rather
than train on with a fleet serving nothing current); nothing is taken out when no server behind that router is
current. A server named directly (no router) cannot be taken out of the workers' rotation: it keeps serving its
version, which its responses report (`meta_info.weight_version`), and the staleness limit handles it.

Requests in flight: a server finishes the requests it is running on the weights it started them with and reports
that version (the local engine swaps between batches, `sao.engines.local_engine`); removing a server from a router
does not cancel what it was already sent. A response therefore carries one version, the one in its own
`weight_version`; an episode whose turns straddle an update records its oldest turn's version.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from typing import Sequence

import aiohttp

from sao.engines import router as router_lib
from sao.engines.sglang_client import EngineError, SGLangEngine

log = logging.getLogger(__name__)


class FleetError(RuntimeError):
  """No server of the fleet reached the published version."""


@dataclasses.dataclass
class ServerState:
  """One server after a publish. router: the router it sits behind ("" = named directly); version: the
  `weight_version` it reported (None: it did not answer); error: why it is not current ("" when it is)."""
  url: str
  router: str = ""
  version: str | None = None
  in_rotation: bool = True
  error: str = ""


def metric_name(url: str) -> str:
  """`http://10.0.0.3:30001/` → `10.0.0.3:30001` (a metric key component)."""
  return re.sub(r"^[a-z]+://", "", url).rstrip("/")


def _as_number(version: str | None) -> float:
  try:
    return float(int(version))  # type: ignore[arg-type]
  except (TypeError, ValueError):
    return -1.0  # no answer, or a version that is not an integer ("default")


@dataclasses.dataclass
class PublishReport:
  """Every known server's state after publishing `version`."""
  version: str
  servers: list[ServerState]

  @property
  def current(self) -> list[ServerState]:
    return [s for s in self.servers if s.version == self.version]

  def metrics(self) -> dict[str, float]:
    """Scalars for the trainer's metrics: counts, and per server its reported version (-1: none) and whether the
    workers' requests reach it (1/0)."""
    out = {"fleet/servers": float(len(self.servers)), "fleet/servers_current": float(len(self.current)),
           "fleet/servers_in_rotation": float(sum(s.in_rotation for s in self.servers))}
    for s in self.servers:
      out[f"fleet/weight_version/{metric_name(s.url)}"] = _as_number(s.version)
      out[f"fleet/in_rotation/{metric_name(s.url)}"] = float(s.in_rotation)
    return out


class Fleet:
  """The servers behind `engine_urls` (routers and/or servers); `publish` updates them (module docstring).

  Args:
    engine_urls: what the rollout workers are given.
    update_timeout_s: how long one server may take to load new weights.
    max_retries: connection retries per server request (a dead server costs about `max_retries` short backoffs).
    api_key: the servers' and routers' token (None: `$SAO_ENGINE_API_KEY` if set).
  """

  def __init__(self, engine_urls: Sequence[str], update_timeout_s: float = 300.0, max_retries: int = 2,
               api_key: str | None = None):
    if not engine_urls:
      raise ValueError("engine_urls: empty; the fleet needs at least one server or router URL")
    self.engine_urls = [u.rstrip("/") for u in engine_urls]
    self.update_timeout_s = update_timeout_s
    self.max_retries = max_retries
    self.api_key = api_key
    self.servers: dict[str, ServerState] = {}  # every server seen, by URL, in discovery order

  async def discover(self) -> dict[str, dict[str, str] | None]:
    """Adds the servers each engine URL stands for to `servers`; returns {engine URL: {server URL: worker id}} for
    routers (None for a URL that is a server). A server a router no longer lists stays known (it is retried)."""
    rotations: dict[str, dict[str, str] | None] = {}
    for url in self.engine_urls:
      async with router_lib.RouterAdmin(url, api_key=self.api_key) as admin:
        try:
          workers = await admin.workers()
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:  # unreachable: the update below reports it
          log.warning("fleet: %s/workers: %s: %s (treated as a server)", url, type(e).__name__, e)
          workers = None
      rotations[url] = workers
      if workers is None:
        if not any(state.router == url for state in self.servers.values()):  # not a router seen before
          self.servers.setdefault(url, ServerState(url))
        continue
      for server in workers:
        state = self.servers.setdefault(server, ServerState(server, router=url))
        state.router, state.in_rotation = url, True
      for state in self.servers.values():
        if state.router == url and state.url not in workers:
          state.in_rotation = False
    return rotations

  async def _update(self, state: ServerState, model_path: str, version: str) -> None:
    """Updates one server and records the version it reports afterwards (never raises for the server's faults)."""
    state.error = ""
    async with SGLangEngine(state.url, timeout_s=self.update_timeout_s, max_retries=self.max_retries,
                            api_key=self.api_key) as engine:
      try:
        await engine.update_weights_from_disk(model_path, weight_version=version)
      except EngineError as e:
        state.error = f"update refused or failed: {e}"
      try:
        reported = (await engine.get_model_info(timeout_s=30.0)).get("weight_version")
        state.version = None if reported is None else str(reported)
      except EngineError as e:
        state.version = None
        state.error = state.error or f"no version: {e}"
    if state.version != version and not state.error:
      state.error = f"reports weight_version {state.version!r} after the update to {version!r}"

  async def publish(self, model_path: str, version: int | str) -> PublishReport:
    """Loads `model_path` (a path the servers can read) as `version` on every server, then sets each router's
    rotation to the servers at `version` (module docstring). FleetError if no server reached it."""
    version = str(version)
    await self.discover()
    states = list(self.servers.values())
    await asyncio.gather(*(self._update(s, model_path, version) for s in states))
    for router_url in dict.fromkeys(s.router for s in states if s.router):
      behind = [s for s in states if s.router == router_url]
      if not any(s.version == version for s in behind):
        log.error("fleet: no server behind %s reached version %s; its rotation is left as it is", router_url, version)
        continue
      async with router_lib.RouterAdmin(router_url, api_key=self.api_key) as admin:
        for s in behind:
          try:
            if s.version != version and s.in_rotation:
              await admin.remove(s.url)
              s.in_rotation = False
              log.warning("fleet: %s taken out of %s's rotation (%s)", s.url, router_url, s.error)
            elif s.version == version and not s.in_rotation:
              await admin.add(s.url)
              s.in_rotation = True
              log.warning("fleet: %s is at version %s again: back in %s's rotation", s.url, version, router_url)
          except (router_lib.RouterError, aiohttp.ClientError, asyncio.TimeoutError) as e:
            # The rotation stays as it was for this server (the report says so); the next publish tries again.
            s.error = f"{s.error}; router {router_url}: {type(e).__name__}: {e}".lstrip("; ")
            log.error("fleet: could not change %s's rotation for %s: %s", router_url, s.url, e)
    for s in states:
      if not s.router and s.version != version:
        log.warning("fleet: %s (no router in front) stays in the workers' rotation at version %s: %s", s.url,
                    s.version, s.error)
    report = PublishReport(version, [dataclasses.replace(s) for s in states])
    if not report.current:
      raise FleetError(f"no server reached weight version {version} ({model_path}): " +
                       "; ".join(f"{s.url}: {s.error}" for s in states))
    return report
