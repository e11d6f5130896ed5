"""SGLangEngine against recorded SGLang response bodies served over loopback HTTP (a real aiohttp server, not a
mock of the client), plus its retry/timeout/error policy."""
from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import re
import socket
import time

import pytest
from aiohttp import web

from sao.engines.sglang_client import (EngineError, EngineOverloadedError, EngineTimeoutError,
                                       EngineUnavailableError, SGLangEngine, parse_generate_response,
                                       retry_after_seconds, sampling_params_to_json)
from sao.models.sampling import SamplingParams

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def fixture(name: str):
  with open(os.path.join(FIXTURES, name)) as f:
    return json.load(f)


def test_parse_recorded_generate_bodies():
  single = parse_generate_response(fixture("generate_single.json"))
  assert single.token_ids == (151657, 198, 4913, 606, 151658, 151645)
  assert single.logprobs[3] == pytest.approx(-0.5204418302)
  assert single.finish_reason == "stop" and single.finish_detail["matched"] == 151645
  assert single.weight_version == "default" and single.prompt_tokens == 412
  batch = parse_generate_response(fixture("generate_batch.json"))
  assert [r.finish_reason for r in batch] == ["stop", "length"]
  assert batch[1].token_ids == (220, 16, 11, 220) and batch[0].weight_version == "12"
  abort = parse_generate_response(fixture("generate_abort.json"))
  assert abort.finish_reason == "abort" and abort.token_ids == ()


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b["meta_info"].pop("output_token_logprobs"), "output_token_logprobs"),
    (lambda b: b["meta_info"].update(finish_reason={"type": "eos"}), "finish_reason"),
    (lambda b: b["meta_info"]["output_token_logprobs"][0].__setitem__(0, None), "log-prob"),
    (lambda b: b.update(output_ids=[1, 2]), "output_ids disagree"),
])
def test_parse_rejects_malformed_bodies(mutate, message):
  body = fixture("generate_single.json")
  mutate(body)
  with pytest.raises(EngineError, match=message):
    parse_generate_response(body)


def test_sampling_params_to_json_uses_sglang_names():
  sp = sampling_params_to_json(SamplingParams(max_new_tokens=7, temperature=0.5, top_k=0, stop_token_ids=(3,)))
  assert sp == {"max_new_tokens": 7, "temperature": 0.5, "top_p": 1.0, "top_k": -1, "stop_token_ids": [3]}


class FixtureServer:
  """A loopback aiohttp server answering with recorded bodies; `fail_first` requests get `fail_status` first (503:
  SGLang's "overloaded")."""

  def __init__(self, fail_first: int = 0, delay_s: float = 0.0, fail_status: int = 503, retry_after: str | None = None):
    self.fail_first = fail_first
    self.retry_after = retry_after  # the failures' Retry-After header (None: none)
    self.fail_status = fail_status
    self.delay_s = delay_s
    self.requests: list[tuple[str, object]] = []

  async def handle(self, request: web.Request) -> web.Response:
    body = await request.json() if request.can_read_body else None
    self.requests.append((request.path, body))
    if len(self.requests) <= self.fail_first:
      message = "scheduler overloaded" if self.fail_status == 503 else "internal error"
      headers = {"Retry-After": self.retry_after} if self.retry_after is not None else None
      return web.json_response({"error": {"message": message}}, status=self.fail_status, headers=headers)
    await asyncio.sleep(self.delay_s)
    if request.path == "/generate":
      if "input_ids" not in body:
        return web.json_response(fixture("error_400.json"), status=400)
      if isinstance(body["input_ids"][0], list):
        return web.json_response(fixture("generate_batch.json"))
      return web.json_response(fixture("generate_single.json"))
    if request.path == "/update_weights_from_disk":
      if body["model_path"].endswith("missing"):
        return web.json_response(fixture("update_weights_from_disk_failed.json"), status=400)
      return web.json_response(fixture("update_weights_from_disk_ok.json"))
    if request.path == "/get_model_info":
      return web.json_response(fixture("get_model_info.json"))
    if request.path == "/flush_cache":
      return web.Response(text="Cache flushed.\nPlease check backend logs for more details.")
    if request.path == "/v1/too_long":
      return web.json_response(fixture("error_400_openai_style.json"), status=400)
    return web.Response(status=200)

  async def __aenter__(self) -> str:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", self.handle)
    self.runner = web.AppRunner(app)
    await self.runner.setup()
    site = web.TCPSite(self.runner, "127.0.0.1", 0)
    await site.start()
    host, port = self.runner.addresses[0][:2]
    return f"http://{host}:{port}"

  async def __aexit__(self, *exc):
    await self.runner.cleanup()


def test_client_round_trips_recorded_bodies():
  async def main():
    server = FixtureServer()
    async with server as url, SGLangEngine(url, timeout_s=10) as engine:
      result = await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=8, temperature=0.0))
      assert result.token_ids[-1] == 151645 and result.finish_reason == "stop"
      path, sent = server.requests[-1]
      assert path == "/generate" and sent["input_ids"] == [1, 2, 3] and sent["return_logprob"] is True
      assert sent["sampling_params"]["max_new_tokens"] == 8
      batch = await engine.generate_batch([[1], [2]], [{"max_new_tokens": 4}, {"max_new_tokens": 4}])
      assert [r.finish_reason for r in batch] == ["stop", "length"]
      info = await engine.update_weights_from_disk("/ckpt/step_00012", weight_version=12)
      assert info["success"] and server.requests[-1][1] == {"model_path": "/ckpt/step_00012", "flush_cache": True,
                                                            "weight_version": "12"}
      with pytest.raises(EngineError, match=r"update_weights_from_disk \(HTTP 400\): Failed to get weights"):
        await engine.update_weights_from_disk("/ckpt/missing")
      assert (await engine.get_model_info())["model_path"] == "Qwen/Qwen3-8B"
      assert await engine.health()
      await engine.flush_cache()
      with pytest.raises(EngineError, match=r"/generate \(HTTP 400\): The input \(8193 tokens\)") as e:
        await engine.request("POST", "/generate", {"text": "x"})
      assert e.value.status == 400
      with pytest.raises(EngineError, match="exceeds the maximum allowed length"):
        await engine.request("POST", "/v1/too_long", {})

  asyncio.run(main())


def test_client_retries_5xx_with_backoff_then_succeeds():
  async def main():
    server = FixtureServer(fail_first=2)
    async with server as url, SGLangEngine(url, max_retries=3, backoff_s=0.05) as engine:
      start = time.monotonic()
      result = await engine.generate([1], {"max_new_tokens": 2})
      assert result.finish_reason == "stop" and len(server.requests) == 3
      assert time.monotonic() - start >= 0.05 + 0.1  # two backoffs: 0.05, then doubled
    server = FixtureServer(fail_first=100, fail_status=500)
    async with server as url, SGLangEngine(url, max_retries=2, backoff_s=0.01) as engine:
      with pytest.raises(EngineUnavailableError, match=r"failed after 3 attempts; last error: HTTP 500: internal"):
        await engine.generate([1], {"max_new_tokens": 2})
      assert len(server.requests) == 3

  asyncio.run(main())


def test_client_backs_off_on_503_beyond_max_retries_until_its_timeout():
  """503 is SGLang's "overloaded": the client keeps backing off (not a failure that uses up `max_retries`) and
  gives up only when the request's timeout is spent, with a timeout error (an agent loop's episode ends as a
  timeout, not as an engine failure)."""
  async def main():
    server = FixtureServer(fail_first=5)
    async with server as url, SGLangEngine(url, max_retries=0, backoff_s=0.01, max_backoff_s=0.02) as engine:
      result = await engine.generate([1], {"max_new_tokens": 2})
      assert result.finish_reason == "stop" and len(server.requests) == 6
    server = FixtureServer(fail_first=10**9)
    async with server as url, SGLangEngine(url, timeout_s=0.3, max_retries=0, backoff_s=0.01,
                                           max_backoff_s=0.05) as engine:
      with pytest.raises(EngineOverloadedError, match=r"stayed overloaded for 0.3s; last answer: HTTP 503: sched") as e:
        await engine.generate([1], {"max_new_tokens": 2})
      assert isinstance(e.value, EngineTimeoutError) and e.value.status == 503 and len(server.requests) > 1

  asyncio.run(main())


def test_client_connection_refused_then_clear_error():
  with socket.socket() as s:  # a port nothing listens on
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]

  async def main():
    async with SGLangEngine(f"http://127.0.0.1:{port}", max_retries=2, backoff_s=0.01) as engine:
      assert not await engine.health()
      with pytest.raises(EngineUnavailableError, match=rf"127.0.0.1:{port}/generate failed after 3 attempts"):
        await engine.generate([1], {"max_new_tokens": 2})

  asyncio.run(main())


def test_client_timeout_is_not_retried():
  async def main():
    server = FixtureServer(delay_s=1.0)
    async with server as url, SGLangEngine(url, timeout_s=0.2, max_retries=3) as engine:
      with pytest.raises(EngineTimeoutError, match="within 0.2s"):
        await engine.generate([1], {"max_new_tokens": 2})
      assert len(server.requests) == 1

  asyncio.run(main())


def _logged_waits(caplog) -> list[float]:
  """The waits the client logged before each retry ("retrying in 0.25s"), in order."""
  return [float(m.group(1)) for r in caplog.records if (m := re.search(r"retrying in ([0-9.]+)s", r.getMessage()))]


def test_retry_after_seconds_parses_seconds_and_http_dates(caplog):
  now = datetime.datetime(2026, 12, 1, 0, 0, 0, tzinfo=datetime.timezone.utc)
  assert retry_after_seconds(None) is None
  assert retry_after_seconds("1") == 1.0 and retry_after_seconds(" 0.5 ") == 0.5
  assert retry_after_seconds("Tue, 01 Dec 2026 00:00:03 GMT", now=now) == 3.0
  assert retry_after_seconds("Mon, 30 Nov 2026 23:59:00 GMT", now=now) == 0.0  # in the past: retry now
  with caplog.at_level(logging.WARNING, logger="sao.engines.sglang_client"):
    assert retry_after_seconds("-1") is None and retry_after_seconds("soon") is None
  assert "ignoring Retry-After '-1'" in caplog.text and "ignoring Retry-After 'soon'" in caplog.text


def test_client_honours_retry_after_on_503(caplog):
  """A 503 with `Retry-After: 1` (the local engine's answer) makes the client wait 1s, not its own 0.01s backoff."""
  async def main():
    server = FixtureServer(fail_first=1, retry_after="1")
    async with server as url, SGLangEngine(url, timeout_s=10, backoff_s=0.01, max_backoff_s=5.0) as engine:
      result = await engine.generate([1], {"max_new_tokens": 2})
      assert result.finish_reason == "stop" and len(server.requests) == 2

  with caplog.at_level(logging.INFO, logger="sao.engines.sglang_client"):
    asyncio.run(main())
  assert _logged_waits(caplog) == [1.0]


def test_client_caps_retry_after_by_max_backoff_and_remaining_timeout(caplog):
  async def main():
    server = FixtureServer(fail_first=2, retry_after="30")
    async with server as url, SGLangEngine(url, timeout_s=10, backoff_s=0.01, max_backoff_s=0.1) as engine:
      assert (await engine.generate([1], {"max_new_tokens": 2})).finish_reason == "stop"
    capped_by_backoff = _logged_waits(caplog)
    caplog.clear()
    server = FixtureServer(fail_first=10**9, retry_after="30")
    async with server as url, SGLangEngine(url, timeout_s=0.4, backoff_s=0.01, max_backoff_s=60.0) as engine:
      with pytest.raises(EngineOverloadedError, match="stayed overloaded for 0.4s"):
        await engine.generate([1], {"max_new_tokens": 2})
    return capped_by_backoff, _logged_waits(caplog)

  with caplog.at_level(logging.INFO, logger="sao.engines.sglang_client"):
    capped_by_backoff, capped_by_timeout = asyncio.run(main())
  assert capped_by_backoff == [0.1, 0.1]
  assert capped_by_timeout and 0.0 < capped_by_timeout[0] <= 0.4 and all(w <= 0.4 for w in capped_by_timeout)
