"""A bad request never fails its batch-mates: validation before batching (400), and a row that fails inside a
batch fails alone. In-process `LocalEngine` + HTTP app with a stand-in sampler (no compilation)."""
from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from sao.engines.http_app import build_app
from sao.engines.local_engine import EngineConfig, LocalEngine
from sao.engines.sglang_client import EngineError, SGLangEngine
from sao.models.sampling import Completion
from tests.engines.helpers import save_tiny_model

RAISES = 7  # a prompt containing this id makes the stand-in sampler raise for its whole batch
NAN = 8  # ... or return NaN log-probs for its row


class StandInSampler:
  """Echoes each prompt's last id twice with log-prob -0.5; records the batches it was called with."""

  def __init__(self):
    self.calls: list[int] = []

  def generate(self, prompts, params, seed):
    self.calls.append(len(prompts))
    if any(RAISES in p.tolist() for p in prompts):
      raise RuntimeError("injected sampler failure")
    return [Completion(token_ids=np.full(2, p[-1], np.int32),
                       logprobs=np.full(2, np.nan if NAN in p.tolist() else -0.5, np.float32),
                       finish_reason="length") for p in prompts]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  return save_tiny_model(str(tmp_path_factory.mktemp("isolation") / "model"))


async def serve(engine: LocalEngine, api_key: str | None = None) -> tuple[web.AppRunner, str]:
  runner = web.AppRunner(build_app(engine, api_key=api_key), access_log=None)
  await runner.setup()
  await web.TCPSite(runner, "127.0.0.1", 0).start()
  host, port = runner.addresses[0][:2]
  return runner, f"http://{host}:{port}"


def make_engine(model_dir: str, max_batch_size: int) -> tuple[LocalEngine, StandInSampler]:
  # A window far longer than any test: a batch closes only when max_batch_size rows are waiting.
  engine = LocalEngine(model_dir, EngineConfig(batch_window_ms=600_000, max_batch_size=max_batch_size,
                                               prefix_cache_bytes=0))  # the stand-in has no model state
  engine.sampler = StandInSampler()
  return engine, engine.sampler


async def post(http: aiohttp.ClientSession, url: str, body: str) -> tuple[int, dict]:
  async with http.post(url + "/generate", data=body, headers={"Content-Type": "application/json"}) as resp:
    return resp.status, await resp.json()


def test_eight_valid_requests_batched_with_bad_ones_all_succeed(model_dir):
  """The bug report's values: each bad request gets 400 naming its field; the 8 good ones form one batch of 8."""
  bad = {
      "sampling_params.top_k": '{"input_ids": [1, 2], "sampling_params": {"top_k": 1099511627776}}',
      "sampling_params.stop_token_ids": '{"input_ids": [1, 2], "sampling_params": {"stop_token_ids": [1099511627776]}}',
      "sampling_params.max_new_tokens": '{"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1e400}}',
      "input_ids": '{"input_ids": [1, 1180591620717411303424], "sampling_params": {}}',
      "sampling_params.temperature": '{"input_ids": [1, 2], "sampling_params": {"temperature": NaN}}',
  }
  engine, sampler = make_engine(model_dir, max_batch_size=8)

  async def main():
    runner, url = await serve(engine)
    try:
      async with aiohttp.ClientSession() as http:
        good = [post(http, url, f'{{"input_ids": [1, {20 + i}], "sampling_params": {{"max_new_tokens": 2}}}}')
                for i in range(8)]
        return await asyncio.gather(*good, *(post(http, url, b) for b in bad.values()))
    finally:
      await runner.cleanup()

  results = asyncio.run(main())
  for i, (status, body) in enumerate(results[:8]):
    assert status == 200, body
    assert body["output_ids"] == [20 + i, 20 + i] and body["meta_info"]["output_token_logprobs"][0][0] == -0.5
  for field, (status, body) in zip(bad, results[8:]):
    assert status == 400 and body["error"]["message"].startswith(field), (field, body)
  assert sampler.calls == [8]  # one batch of the 8 valid rows; no bad row reached the sampler


@pytest.mark.parametrize("poison", [RAISES, NAN], ids=["sampler_raises", "nan_logprobs"])
def test_a_row_failing_inside_a_batch_fails_alone(model_dir, poison):
  engine, sampler = make_engine(model_dir, max_batch_size=4)

  async def main():
    runner, url = await serve(engine)
    try:
      async with SGLangEngine(url, max_retries=0) as client:
        sp = {"max_new_tokens": 2}
        outcomes = await asyncio.gather(*(client.generate([1, i], sp) for i in (30, poison, 31, 32)),
                                        return_exceptions=True)
        after = await client.generate_batch([[1, 33 + i] for i in range(4)], sp)  # the engine keeps serving
        return outcomes, after, (await client.get_model_info())["stats"]
    finally:
      await runner.cleanup()

  outcomes, after, stats = asyncio.run(main())
  assert [o.token_ids for o in (outcomes[0], outcomes[2], outcomes[3])] == [(30, 30), (31, 31), (32, 32)]
  failed = outcomes[1]
  assert isinstance(failed, EngineError) and "HTTP 500: generation failed" in failed.message, failed
  assert ("injected sampler failure" if poison == RAISES else "non-finite log-probs") in failed.message
  assert [r.token_ids[0] for r in after] == [33, 34, 35, 36]
  # One batch of 4; the sampler-raises case re-runs all 4 rows alone, the NaN case only the NaN row.
  assert sampler.calls == ([4, 1, 1, 1, 1] if poison == RAISES else [4, 1]) + [4]
  assert stats["failed_rows"] == 1 and stats["isolated_batches"] == (1 if poison == RAISES else 0)


def test_token_is_required_when_set_and_health_stays_open(model_dir):
  engine, _ = make_engine(model_dir, max_batch_size=1)

  async def main():
    runner, url = await serve(engine, api_key="s3cret")
    try:
      async with SGLangEngine(url, max_retries=0) as anonymous, \
          SGLangEngine(url, max_retries=0, api_key="wrong") as wrong, \
          SGLangEngine(url, max_retries=0, api_key="s3cret") as client:
        assert await anonymous.health()  # liveness only, as SGLang: a launcher polls it without the token
        for other in (anonymous, wrong):
          with pytest.raises(EngineError, match=r"HTTP 401\): missing or wrong token") as e:
            await other.generate([1, 2], {"max_new_tokens": 2})
          assert e.value.status == 401
          with pytest.raises(EngineError, match="HTTP 401"):
            await other.get_model_info()
        return await client.generate([1, 2], {"max_new_tokens": 2})
    finally:
      await runner.cleanup()

  assert asyncio.run(main()).token_ids == (2, 2)


def test_sglang_client_reads_the_token_from_the_environment(monkeypatch):
  monkeypatch.setenv("SAO_ENGINE_API_KEY", "from-env")
  assert SGLangEngine("http://127.0.0.1:1")._headers == {"Authorization": "Bearer from-env"}
  assert SGLangEngine("http://127.0.0.1:1", api_key="given")._headers == {"Authorization": "Bearer given"}
  monkeypatch.delenv("SAO_ENGINE_API_KEY")
  assert SGLangEngine("http://127.0.0.1:1")._headers == {}
