"""Fake SGLang servers for the fleet tests: each serves `/generate` (its current weight version in `meta_info`),
`/update_weights_from_disk`, `/get_model_info` and `/health` on a loopback port from a thread of its own (so a
router subprocess can health-check it while the test blocks), and can refuse updates, lag, or go away."""
from __future__ import annotations

import asyncio
import threading

from aiohttp import web

from sao.engines import router as router_lib


class FakeServer:
  """A server whose behaviour the test sets: `refuse` (400 to updates), `lag` (says success, keeps its version),
  `generate_delay_s` (each /generate waits this long). `served` counts the /generate requests it answered."""

  def __init__(self, version: str = "0"):
    self.version = version
    self.refuse = False
    self.lag = False
    self.generate_delay_s = 0.0
    self.served = 0
    self.updates: list[tuple[str, str]] = []  # (model_path, weight_version) it was asked to load
    self.port = router_lib.free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self._loop = asyncio.new_event_loop()
    self._runner: web.AppRunner | None = None
    ready = threading.Event()
    self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
    self._thread.start()
    if not ready.wait(10):
      raise RuntimeError(f"fake server on {self.url} did not start")

  def _app(self) -> web.Application:
    async def generate(request):
      body = await request.json()
      version = self.version  # the version it starts the request on is the one it reports
      await asyncio.sleep(self.generate_delay_s)
      self.served += 1
      n = body.get("sampling_params", {}).get("max_new_tokens", 2)
      ids = [3 + i for i in range(n)]
      return web.json_response({"text": "", "output_ids": ids, "meta_info": {
          "output_token_logprobs": [[-0.5, t, None] for t in ids], "finish_reason": {"type": "length"},
          "weight_version": version, "prompt_tokens": len(body["input_ids"]), "completion_tokens": n}})

    async def update(request):
      body = await request.json()
      self.updates.append((body["model_path"], body.get("weight_version")))
      if self.refuse:
        return web.json_response({"success": False, "message": "refused (test)"}, status=400)
      if not self.lag:
        self.version = body.get("weight_version") or self.version
      return web.json_response({"success": True, "message": "Succeeded to update model weights."})

    async def info(request):
      return web.json_response({"model_path": "/fake", "weight_version": self.version, "is_generation": True})

    async def health(request):
      return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_post("/update_weights_from_disk", update)
    app.router.add_get("/get_model_info", info)
    app.router.add_get("/health", health)
    return app

  def _serve(self, ready: threading.Event) -> None:
    asyncio.set_event_loop(self._loop)
    self._runner = web.AppRunner(self._app(), access_log=None)
    self._loop.run_until_complete(self._runner.setup())
    self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
    ready.set()
    self._loop.run_forever()

  def stop(self) -> None:
    """Closes its port (connections are refused from now on) and ends its thread."""
    if self._runner is None or not self._thread.is_alive():
      return
    asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
    self._loop.call_soon_threadsafe(self._loop.stop)
    self._thread.join(10)
