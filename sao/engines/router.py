"""`sglang-router` in front of inference servers: its process (start on a free port, wait until it routes, stop) and
its worker admin API (which servers are in its rotation; take one out, put it back).

    router = start_router(["http://127.0.0.1:30001", "http://127.0.0.1:30002"], log_path="logs/router.log")
    ...                                   # clients send /generate to router.url; the router picks a server
    await RouterAdmin(router.url).workers()        # {server URL: worker id}
    router.stop()

The router (sglang-router 0.3.x, `python -m sglang_router.launch_router`; started here as
`python -m sao.engines.router <its flags>`, which first arranges to end with its launcher, `lifetime`) forwards
`/generate` to one server and returns its body unchanged (log-probs and `meta_info.weight_version` included); a
request whose server refuses the connection is retried on another (`--retry-max-retries`). It does NOT forward
`/update_weights_from_disk` (404): `sao.engines.fleet` updates every server itself. Its admin API, checked against the
0.3.2 binary:

  GET    /workers                 {"workers": [{"id": <uuid>, "url", "is_healthy", ...}], "total", ...}
  POST   /workers                 {"url": <server URL>} → 202 {"worker_id", ...}: added in the background
  DELETE /workers/<worker id>     → 202: removed in the background (no new request goes to it)
  GET    /readiness               {"status": "ready", "healthy_workers", "total_workers"}

Changes are applied asynchronously (202), so `add`/`remove` poll `GET /workers` until the change shows. The
`sglang-router` package is an extra (`pip install -e ".[test]"`); `require_router()` says so when it is missing.
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import socket
import sys
import tempfile
import time
import urllib.request
from typing import Any, Mapping, Sequence

import aiohttp

from sao.engines import auth, lifetime, processes

POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")
INSTALL_HINT = ('sglang-router is not installed; it is in the test extra: pip install -e ".[test]" '
                '(or pip install "sglang-router>=0.3.2,<0.4")')


class RouterError(RuntimeError):
  """The router refused an admin request or did not apply it in time."""


def require_router() -> None:
  """Raises ImportError with the install command when the `sglang_router` package is missing."""
  if importlib.util.find_spec("sglang_router") is None:
    raise ImportError(INSTALL_HINT)


def free_port(host: str = "127.0.0.1") -> int:
  with socket.socket() as s:
    s.bind((host, 0))
    return s.getsockname()[1]


def router_argv(worker_urls: Sequence[str], port: int, *, host: str = "127.0.0.1", policy: str = "cache_aware",
                prometheus_port: int, python: str = sys.executable,
                extra_args: Sequence[str] = ()) -> list[str]:
  """The router's command line (`sao.engines.router` run as a program: `sglang_router.launch_router` that ends with
  its launcher). `prometheus_port`: its metrics port (the default, 29000, is one port for every router on a
  machine: two runs' routers would collide)."""
  if policy not in POLICIES:
    raise ValueError(f"policy: {policy!r} is not one of {POLICIES}")
  if not worker_urls:
    raise ValueError("worker_urls: empty; the router needs at least one server")
  return [python, "-m", "sao.engines.router", "--worker-urls", *worker_urls, "--host", host,
          "--port", str(port), "--policy", policy, "--prometheus-host", host, "--prometheus-port",
          str(prometheus_port), "--log-level", "warn", *extra_args]


def _get_json(url: str, timeout_s: float = 5.0) -> Any:
  """GET `url` → decoded JSON; None when it cannot be reached or does not answer 200 with JSON."""
  try:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
      return json.loads(resp.read()) if resp.status == 200 else None
  except (OSError, ValueError):
    return None


def _routes_to_all(url: str, n: int) -> bool:
  body = _get_json(url + "/readiness")
  return isinstance(body, Mapping) and body.get("healthy_workers") == n


class RouterProcess(processes.ChildProcess):
  """An `sglang_router.launch_router` child process; `url` is where it serves."""
  url: str = ""


def start_router(worker_urls: Sequence[str], *, log_path: str | None = None, host: str = "127.0.0.1",
                 port: int = 0, policy: str = "cache_aware", startup_timeout_s: float = 60.0,
                 env: Mapping[str, str] | None = None, extra_args: Sequence[str] = (),
                 name: str = "router") -> RouterProcess:
  """Starts the router in front of `worker_urls` (servers already serving) on `port` (0: a free one) and waits
  until it reports every server healthy. ImportError naming the extra when sglang-router is missing;
  `processes.ChildError` if it exits first, TimeoutError after `startup_timeout_s` (the router stopped)."""
  require_router()
  if log_path is None:
    fd, log_path = tempfile.mkstemp(prefix="sao-router-", suffix=".log")
    os.close(fd)
  port = port or free_port(host)
  argv = router_argv(worker_urls, port, host=host, policy=policy, prometheus_port=free_port(host),
                     extra_args=extra_args)
  handle = RouterProcess(name, argv, log_path, env=env, fresh_log=True, stop_timeout_s=10.0)
  handle.url = f"http://{host}:{port}"
  handle.start()
  try:
    handle.wait_ready(lambda: _routes_to_all(handle.url, len(worker_urls)), startup_timeout_s, poll_s=0.1)
  except BaseException:
    handle.stop()
    raise
  return handle


class RouterAdmin:
  """The router's worker admin API (module docstring), over one aiohttp session; `async with` or `close()`.
  `api_key`: the router's `--api-key` (None: `$SAO_ENGINE_API_KEY` if set)."""

  def __init__(self, url: str, timeout_s: float = 10.0, apply_timeout_s: float = 30.0, api_key: str | None = None):
    self.url = url.rstrip("/")
    self.timeout = aiohttp.ClientTimeout(total=timeout_s)
    self.apply_timeout_s = apply_timeout_s
    api_key = auth.token_from_env(api_key)
    self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    self._session: aiohttp.ClientSession | None = None

  async def __aenter__(self) -> RouterAdmin:
    return self

  async def __aexit__(self, *exc: Any) -> None:
    await self.close()

  async def close(self) -> None:
    if self._session is not None:
      await self._session.close()
    self._session = None

  def _get_session(self) -> aiohttp.ClientSession:
    if self._session is None or self._session.closed:
      self._session = aiohttp.ClientSession(headers=self._headers, timeout=self.timeout)
    return self._session

  async def _call(self, method: str, path: str, payload: Any = None) -> tuple[int, Any]:
    async with self._get_session().request(method, self.url + path, json=payload) as resp:
      text = await resp.text()
      try:
        return resp.status, json.loads(text) if text.strip() else None
      except ValueError:
        return resp.status, text

  async def workers(self) -> dict[str, str] | None:
    """{server URL: worker id} of the router's rotation; None when `url` is not a router (a server: 404)."""
    status, body = await self._call("GET", "/workers")
    if status == 404:
      return None
    if status != 200 or not isinstance(body, Mapping) or not isinstance(body.get("workers"), list):
      raise RouterError(f"{self.url}: GET /workers answered {status} (a router lists its servers there, a server "
                        f"answers 404): {str(body)[:300]}")
    return {str(w["url"]).rstrip("/"): str(w["id"]) for w in body["workers"]}

  async def _until(self, what: str, done) -> None:
    deadline = time.monotonic() + self.apply_timeout_s
    while True:
      if done(await self.workers() or {}):
        return
      if time.monotonic() > deadline:
        raise RouterError(f"router {self.url}: {what} not applied within {self.apply_timeout_s:g}s")
      await asyncio.sleep(0.05)

  async def remove(self, server_url: str) -> None:
    """Takes `server_url` out of the rotation (a no-op when it is not in it); returns once the router lists it no
    more. Requests already forwarded to it are not cancelled."""
    server_url = server_url.rstrip("/")
    worker_id = (await self.workers() or {}).get(server_url)
    if worker_id is None:
      return
    status, body = await self._call("DELETE", f"/workers/{worker_id}")
    if status not in (200, 202, 204):
      raise RouterError(f"router {self.url}: DELETE /workers/{worker_id} ({server_url}) answered {status}: {body}")
    await self._until(f"removing {server_url}", lambda w: server_url not in w)

  async def add(self, server_url: str) -> None:
    """Puts `server_url` (a serving server) into the rotation (a no-op when it is in it); returns once listed."""
    server_url = server_url.rstrip("/")
    if server_url in (await self.workers() or {}):
      return
    payload: dict[str, Any] = {"url": server_url}
    api_key = self._headers.get("Authorization", "").removeprefix("Bearer ")
    if api_key:
      payload["api_key"] = api_key  # the router calls the server with it
    status, body = await self._call("POST", "/workers", payload)
    if status not in (200, 201, 202):
      raise RouterError(f"router {self.url}: POST /workers {server_url} answered {status}: {body}")
    await self._until(f"adding {server_url}", lambda w: server_url in w)


__all__ = ["INSTALL_HINT", "POLICIES", "RouterAdmin", "RouterError", "RouterProcess", "free_port",
           "require_router", "router_argv", "start_router"]


def main(argv: Sequence[str]) -> None:
  """`python -m sao.engines.router <sglang_router.launch_router flags>`: the router, ending with its launcher."""
  lifetime.exit_with_parent()
  require_router()
  from sglang_router import launch_router  # pylint: disable=g-import-not-at-top
  launch_router.launch_router(launch_router.parse_router_args(list(argv)))


if __name__ == "__main__":
  main(sys.argv[1:])
