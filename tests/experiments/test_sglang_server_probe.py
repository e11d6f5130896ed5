"""`experiments/bench/sglang_server_probe.py` against the local engine (an SGLang-compatible server, in-process, with
a stand-in sampler: no compilation): every call succeeds, the three `/generate` bodies are written and are what the
client parses (a `length` and a `stop` finish, a batch of two), and a server without `/update_weights_from_disk` is
reported, not fatal."""
from __future__ import annotations

import asyncio
import json

import numpy as np
from aiohttp import web

from experiments.bench.sglang_server_probe import probe
from sao.engines.http_app import build_app
from sao.engines.local_engine import EngineConfig, LocalEngine
from sao.engines.sglang_client import parse_generate_response
from sao.models.sampling import Completion
from tests.engines.helpers import save_tiny_model


class FirstIdSampler:
  """Answers each row with ids 3, 4, ... (up to its max_new_tokens), stopping at the first that is a stop id."""

  def generate(self, prompts, params, seed):
    out = []
    for sp in params:
      ids = []
      for t in range(3, 3 + sp.max_new_tokens):
        ids.append(t)
        if t in sp.stop_token_ids:
          break
      stopped = ids[-1] in sp.stop_token_ids
      out.append(Completion(token_ids=np.asarray(ids, np.int32), logprobs=np.full(len(ids), -0.25, np.float32),
                            finish_reason="stop" if stopped else "length"))
    return out

  def update_params(self, params):
    pass


def _run(model_dir: str, record_dir: str, without_update: bool) -> bool:
  engine = LocalEngine(model_dir, EngineConfig(batch_window_ms=0, max_batch_size=2, prompt_buckets=(16,),
                                               batch_buckets=(2,), new_token_buckets=(8,), max_stop_ids=1024,
                                               prefix_cache_bytes=0))
  engine.sampler = FirstIdSampler()
  app = build_app(engine)
  if without_update:  # as sglang-jax: the route does not exist
    @web.middleware
    async def no_update(request, handler):
      if request.path == "/update_weights_from_disk":
        raise web.HTTPNotFound()
      return await handler(request)
    app.middlewares.append(no_update)

  async def main():
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
      return await probe(f"http://{host}:{port}", engine.model_config.vocab_size, record_dir, None)
    finally:
      await runner.cleanup()

  return asyncio.run(main())


def test_probe_records_what_the_client_parses(tmp_path, capsys):
  model_dir = save_tiny_model(str(tmp_path / "model"))
  assert _run(model_dir, str(tmp_path / "rec"), without_update=False)
  printed = capsys.readouterr().out
  assert "FAILED" not in printed and "update_weights_from_disk: ok" in printed
  results = {}
  for name in ("generate_length", "generate_stop", "generate_batch"):
    with open(tmp_path / "rec" / f"{name}.json") as f:
      results[name] = parse_generate_response(json.load(f))
  assert results["generate_length"].finish_reason == "length" and results["generate_length"].token_ids == (3, 4, 5)
  assert results["generate_stop"].finish_reason == "stop" and results["generate_stop"].token_ids == (3,)
  assert [r.token_ids for r in results["generate_batch"]] == [(3, 4), (3,)]

  assert _run(model_dir, str(tmp_path / "rec2"), without_update=True)  # reported, the probe still passes
  assert "update_weights_from_disk: FAILED EngineError: engine /update_weights_from_disk (HTTP 404)" in \
      capsys.readouterr().out
