"""The local engine's routed experts in SGLang's format (`--enable-return-routed-experts`, request field
`return_routed_experts`, `meta_info["routed_experts"]`: base64 of int32 [prompt + completion − 1, layers, top_k]),
through the HTTP app and the SGLang client, in process on a tiny MoE model."""
from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from sao.engines import serve as serve_module
from sao.engines.http_app import build_app
from sao.engines.local_engine import EngineConfig, LocalEngine
from sao.engines.sglang_client import EngineError, SGLangEngine
from sao.models import routed_experts as routing
from sao.models.config import ModelConfig
from sao.models.hf import load_pretrained, save_pretrained
from sao.models.transformer import CausalLM
from tests.models.helpers import random_params

BUCKETS = dict(prompt_buckets=(32,), batch_buckets=(2,), new_token_buckets=(8,), max_batch_size=2)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
  config = ModelConfig.tiny("qwen3_moe", mlp_only_layers=(0,), num_layers=3)  # layer 0 dense: −1 rows on the wire
  directory = str(tmp_path_factory.mktemp("moe") / "model")
  save_pretrained(config, random_params(config, seed=7), directory)
  return directory


async def _with_server(engine: LocalEngine, fn):
  runner = web.AppRunner(build_app(engine), access_log=None)
  await runner.setup()
  await web.TCPSite(runner, "127.0.0.1", 0).start()
  host, port = runner.addresses[0][:2]
  try:
    return await fn(f"http://{host}:{port}")
  finally:
    await runner.cleanup()


def _trainer_routing(model_dir: str, tokens: list[int]) -> np.ndarray:
  config, params = load_pretrained(model_dir)
  ids = np.asarray(tokens, np.int32)[None]
  (_, _), captured = CausalLM(config).apply({"params": params}, ids, method=CausalLM.hidden,
                                            mutable=[routing.COLLECTION])
  return np.asarray(routing.stack_captured(config, captured, ids.shape))[0]


def test_routed_experts_round_trip_through_http_and_client(moe_dir):
  """Raw body: base64 of int32 [P + n − 1, L, k], −1 on the dense layer; client: the same rows flattened per token;
  the second turn continues from the first conversation in the prefix cache (its routing kept beside the state) and
  is still covered from token 0; both name the experts the trainer's own forward routes those tokens to (same
  weights, float32)."""
  config, _ = load_pretrained(moe_dir)
  engine = LocalEngine(moe_dir, EngineConfig(enable_return_routed_experts=True, **BUCKETS))
  prompt = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28]  # > one 16-token cache block
  sp = {"max_new_tokens": 6, "temperature": 0.0}

  async def talk(url):
    async with aiohttp.ClientSession() as http:
      async with http.post(url + "/generate", json={"input_ids": prompt, "sampling_params": sp,
                                                    "return_routed_experts": True}) as resp:
        assert resp.status == 200
        raw = await resp.json()
      async with http.post(url + "/generate", json={"input_ids": prompt, "sampling_params": sp}) as resp:
        plain = await resp.json()
    async with SGLangEngine(url, return_routed_experts=True) as client:
      first = await client.generate(prompt, sp)
      second_prompt = prompt + list(first.token_ids) + [9, 10]
      second = await client.generate(second_prompt, sp)
    return raw, plain, first, second_prompt, second

  raw, plain, first, second_prompt, second = asyncio.run(_with_server(engine, talk))
  # Cached prompt tokens: `plain` reused `raw`'s entry (P − 1) and replaced it by one without routing, which `first`
  # (asking) skipped; the second turn continued from `first`'s whole conversation (P + 6), its routing recorded.
  assert engine.stats["cached_prompt_tokens"] == (len(prompt) - 1) + (len(prompt) + 6)
  assert "routed_experts" not in plain["meta_info"]  # only rows that ask
  tokens = prompt + raw["output_ids"]
  wire = routing.decode(raw["meta_info"]["routed_experts"], config.num_layers, config.num_experts_per_tok)
  assert wire.shape == (len(tokens) - 1, 3, 2)
  assert (wire[:, 0] == -1).all() and (wire[:, 1:] >= 0).all()
  np.testing.assert_array_equal(wire, _trainer_routing(moe_dir, tokens)[:-1])
  np.testing.assert_array_equal(first.routed_experts, wire.reshape(len(tokens) - 1, -1))
  tokens2 = second_prompt + list(second.token_ids)
  assert second.routed_experts.shape == (len(tokens2) - 1, 6)
  np.testing.assert_array_equal(second.routed_experts, _trainer_routing(moe_dir, tokens2)[:-1].reshape(-1, 6))


def test_routed_experts_refusals(moe_dir, tmp_path):
  """Without the server flag a request asking for them gets 400 naming the flag; a dense model refuses the flag; a
  client that asked but got no field fails naming it; SGLang's dashed flag spelling reaches the absl flag."""
  engine = LocalEngine(moe_dir, EngineConfig(**BUCKETS))

  async def ask(url):
    async with SGLangEngine(url, return_routed_experts=True, max_retries=0) as client:
      with pytest.raises(EngineError, match="--enable-return-routed-experts") as raised:
        await client.generate([1, 2, 3], {"max_new_tokens": 2})
      assert raised.value.status == 400
      with pytest.raises(EngineError, match="return_routed_experts: expected a boolean"):
        await client.generate([1, 2, 3], {"max_new_tokens": 2}, return_routed_experts="yes")

  asyncio.run(_with_server(engine, ask))
  dense = ModelConfig.tiny("qwen3")
  save_pretrained(dense, random_params(dense), str(tmp_path / "dense"))
  with pytest.raises(ValueError, match="no MoE layers"):
    LocalEngine(str(tmp_path / "dense"), EngineConfig(enable_return_routed_experts=True, **BUCKETS))
  from sao.engines.sglang_client import parse_generate_item
  item = {"meta_info": {"output_token_logprobs": [[-0.1, 5, None]], "finish_reason": {"type": "length"},
                        "prompt_tokens": 3}}
  with pytest.raises(EngineError, match="missing meta_info.routed_experts"):
    parse_generate_item(item, routed_experts=True)
  item["meta_info"]["routed_experts"] = routing.encode(np.zeros((1, 1, 4), np.int32))  # 4 ids, 3 rows
  with pytest.raises(EngineError, match="do not split into 3 token rows"):
    parse_generate_item(item, routed_experts=True)
  assert serve_module.sglang_spelling(["serve", "--enable-return-routed-experts", "--port=1"]) == [
      "serve", "--enable_return_routed_experts", "--port=1"]
