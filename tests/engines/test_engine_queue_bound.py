"""The local engine's queue is bounded (`EngineConfig.max_queued_rows`): a request that would take the waiting rows
past the bound gets HTTP 503 and nothing of it is queued; once the queue drains, requests are accepted again; the
SGLang client backs off on a 503 and gets its answer. In-process `LocalEngine` + HTTP app with a stand-in sampler
that blocks until released (no compilation)."""
from __future__ import annotations

import asyncio
import threading

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from sao.engines.http_app import build_app
from sao.engines.local_engine import EngineConfig, LocalEngine
from sao.engines.sglang_client import SGLangEngine
from sao.models.sampling import Completion
from tests.engines.helpers import save_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  return save_tiny_model(str(tmp_path_factory.mktemp("queue_bound") / "model"))


async def serve(engine: LocalEngine) -> tuple[web.AppRunner, str]:
  runner = web.AppRunner(build_app(engine), access_log=None)
  await runner.setup()
  await web.TCPSite(runner, "127.0.0.1", 0).start()
  host, port = runner.addresses[0][:2]
  return runner, f"http://{host}:{port}"


async def post(http: aiohttp.ClientSession, url: str, body: str) -> tuple[int, dict]:
  async with http.post(url + "/generate", data=body, headers={"Content-Type": "application/json"}) as resp:
    return resp.status, await resp.json()


class GatedSampler:
  """Echoes each prompt's last id once; every call waits until `gate` is set, so rows pile up in the queue."""

  def __init__(self):
    self.gate = threading.Event()
    self.running = threading.Event()  # set once the first batch is inside the sampler
    self.calls: list[int] = []

  def generate(self, prompts, params, seed):
    self.running.set()
    assert self.gate.wait(60), "the test never released the sampler"
    self.calls.append(len(prompts))
    return [Completion(token_ids=np.full(1, p[-1], np.int32), logprobs=np.full(1, -0.5, np.float32),
                       finish_reason="length") for p in prompts]


def _engine(model_dir: str, max_queued_rows: int) -> tuple[LocalEngine, GatedSampler]:
  engine = LocalEngine(model_dir, EngineConfig(batch_window_ms=0, max_batch_size=1, max_queued_rows=max_queued_rows,
                                               prefix_cache_bytes=0))  # the stand-in has no model state
  engine.sampler = GatedSampler()
  return engine, engine.sampler


def _body(*last_ids: int) -> str:
  prompts = [f"[1, {i}]" for i in last_ids]
  ids = prompts[0] if len(prompts) == 1 else f"[{', '.join(prompts)}]"
  return f'{{"input_ids": {ids}, "sampling_params": {{"max_new_tokens": 1}}}}'


def test_full_queue_answers_503_then_accepts_after_draining(model_dir):
  engine, sampler = _engine(model_dir, max_queued_rows=2)

  async def main():
    runner, url = await serve(engine)
    try:
      async with aiohttp.ClientSession() as http:
        first = asyncio.create_task(post(http, url, _body(10)))  # runs (and blocks) in the sampler: not queued
        await asyncio.to_thread(sampler.running.wait, 60)
        waiting = [asyncio.create_task(post(http, url, _body(11))), asyncio.create_task(post(http, url, _body(12)))]
        while engine._queue.qsize() < 2:  # both rows queued behind the blocked batch
          await asyncio.sleep(0.01)
        async with http.post(url + "/generate", data=_body(13)) as resp:
          full = resp.status, resp.headers.get("Retry-After"), await resp.json()
        batch_full = await post(http, url, _body(14, 15))  # a 2-row request does not fit either
        too_big = await post(http, url, _body(16, 17, 18))  # never fits: the client's error, not overload
        sampler.gate.set()
        served = await asyncio.gather(first, *waiting)
        after = await post(http, url, _body(19, 20))  # drained: two rows fit again
        return full, batch_full, too_big, served, after
    finally:
      await runner.cleanup()

  full, batch_full, too_big, served, after = asyncio.run(main())
  status, retry_after, body = full
  assert status == 503 and retry_after == "1", full
  assert "engine overloaded: 2 rows wait for a batch" in body["error"]["message"]
  assert "max_queued_rows=2" in body["error"]["message"]
  assert batch_full[0] == 503
  assert too_big[0] == 400 and "more than the engine queues (max_queued_rows=2)" in too_big[1]["error"]["message"]
  assert [(s, b["output_ids"]) for s, b in served] == [(200, [10]), (200, [11]), (200, [12])]
  assert after[0] == 200 and [r["output_ids"] for r in after[1]] == [[19], [20]]
  assert sampler.calls == [1, 1, 1, 1, 1]  # the refused requests never reached the sampler
  assert engine.stats["overloaded_requests"] == 2


def test_sglang_client_backs_off_on_503_until_the_queue_has_room(model_dir):
  """More concurrent clients than the queue holds, each with no retries for failures: every one is served (the
  refused ones back off and ask again), none fails."""
  engine, sampler = _engine(model_dir, max_queued_rows=1)

  async def main():
    runner, url = await serve(engine)
    try:
      async with SGLangEngine(url, max_retries=0, backoff_s=0.01, max_backoff_s=0.05, timeout_s=60) as client:
        requests = [asyncio.create_task(client.generate([1, 30 + i], {"max_new_tokens": 1})) for i in range(4)]
        while engine.stats["overloaded_requests"] < 2:  # at least two were refused while the sampler is blocked
          await asyncio.sleep(0.01)
        sampler.gate.set()
        return await asyncio.gather(*requests)
    finally:
      await runner.cleanup()

  results = asyncio.run(main())
  assert [r.token_ids for r in results] == [(30,), (31,), (32,), (33,)]
  assert engine.stats["requests"] == 4 and engine.stats["overloaded_requests"] >= 2


def test_max_queued_rows_must_be_positive():
  with pytest.raises(ValueError, match="max_queued_rows: must be >= 1"):
    EngineConfig(max_queued_rows=0)
