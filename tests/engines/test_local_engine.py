"""The local JAX engine as a real server process on a loopback port, driven through SGLangEngine."""
from __future__ import annotations

import asyncio

import jax
import numpy as np
import pytest

from sao.engines.sglang_client import EngineError, SGLangEngine
from sao.models.hf import load_pretrained
from sao.models.logprobs import token_logprobs
from tests.engines.helpers import save_tiny_model, start_engine

PROMPTS = [[0, 265, 17, 40, 41, 42], [0, 266, 17, 300, 301], [0, 265, 17, 99], [0, 265, 17, 7, 8, 9, 10, 11, 12]]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  base = tmp_path_factory.mktemp("engine")
  model_dir = save_tiny_model(str(base / "model_a"), seed=0)
  other_dir = save_tiny_model(str(base / "model_b"), seed=1)
  proc, url = start_engine(model_dir, str(tmp_path_factory.getbasetemp() / "jax_cache"))
  yield {"url": url, "model_dir": model_dir, "other_dir": other_dir, "proc": proc}
  proc.stop()


def run(coro_fn, url, **kwargs):
  async def main():
    async with SGLangEngine(url, timeout_s=120, **kwargs) as engine:
      return await coro_fn(engine)
  return asyncio.run(main())


def rescored(model_dir, prompt, completion, temperature):
  """token_logprobs of prompt + completion, at the completion's positions (right-padded to 64: one compile)."""
  config, params = load_pretrained(model_dir)
  seq = list(prompt) + list(completion)
  ids = np.zeros((1, 64), np.int32)
  ids[0, :len(seq)] = seq
  mask = (np.arange(64) < len(seq)).astype(np.int32)[None]
  lp = _score(params, config, ids, mask, temperature)
  return np.asarray(lp)[0, len(prompt):len(seq)]


_score = jax.jit(token_logprobs, static_argnames=("config",))


def test_generate_logprobs_equal_recomputed_token_logprobs(served):
  sp = {"max_new_tokens": 12, "temperature": 0.7, "top_p": 0.9, "top_k": 50}
  result = run(lambda e: e.generate(PROMPTS[0], sp), served["url"])
  assert len(result.token_ids) == 12 and result.finish_reason == "length" and result.weight_version == "0"
  np.testing.assert_allclose(result.logprobs, rescored(served["model_dir"], PROMPTS[0], result.token_ids, 0.7),
                             atol=2e-5)
  assert result.text is not None


def test_concurrent_requests_are_batched_and_equal_unbatched_greedy(served):
  greedy = {"max_new_tokens": 10, "temperature": 0.0}

  async def sequential(engine):
    return [await engine.generate(p, greedy) for p in PROMPTS]

  async def concurrent(engine):
    before = (await engine.get_model_info())["stats"]
    results = await asyncio.gather(*(engine.generate(p, greedy) for p in PROMPTS))
    after = (await engine.get_model_info())["stats"]
    return results, before, after

  alone = run(sequential, served["url"])
  together, before, after = run(concurrent, served["url"])
  batches = after["batches"] - before["batches"]
  assert after["rows"] - before["rows"] == len(PROMPTS)
  assert batches < len(PROMPTS) and after["max_rows_per_batch"] > 1, (before, after)
  for a, b in zip(alone, together):
    assert a.token_ids == b.token_ids
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
  # Greedy reports the temperature-1 log-probs of the argmax tokens.
  np.testing.assert_allclose(alone[1].logprobs, rescored(served["model_dir"], PROMPTS[1], alone[1].token_ids, 1.0),
                             atol=2e-5)


def test_batch_form_and_stop_tokens(served):
  async def main(engine):
    first = await engine.generate(PROMPTS[2], {"max_new_tokens": 8, "temperature": 0.0})
    stop_at = first.token_ids[2]  # stop on the third greedy token (or earlier if it repeats)
    return first, stop_at, await engine.generate_batch(
        PROMPTS[2:4], [{"max_new_tokens": 8, "temperature": 0.0, "stop_token_ids": [stop_at]},
                       {"max_new_tokens": 3, "temperature": 1.0}])

  first, stop_at, (stopped, short) = run(main, served["url"])
  k = first.token_ids.index(stop_at) + 1
  assert stopped.token_ids == first.token_ids[:k] and stopped.finish_reason == "stop"
  assert len(short.token_ids) == 3 and short.finish_reason == "length"


def test_malformed_requests_get_400_with_a_clear_message(served):
  async def main(engine):
    with pytest.raises(EngineError, match=r"/generate \(HTTP 400\): input_ids: required") as e:
      await engine.request("POST", "/generate", {"sampling_params": {}})
    assert e.value.status == 400
    with pytest.raises(EngineError, match=r"token id 100000 at position 1 is out of range \[0, \d+\)"):
      await engine.generate([1, 100000], {"max_new_tokens": 2})
    with pytest.raises(EngineError, match=r"max_new_tokens: must be >= 1"):
      await engine.generate([1], {"max_new_tokens": 0})
    with pytest.raises(EngineError, match=r"does not fit the context length"):
      await engine.generate([1] * 600, {"max_new_tokens": 2})
    with pytest.raises(EngineError, match=r"not a directory"):
      await engine.update_weights_from_disk("/nonexistent/ckpt")
    assert await engine.health()
    await engine.flush_cache()

  run(main, served["url"], max_retries=0)


def test_weight_update_bumps_version_and_changes_outputs(served):
  greedy = {"max_new_tokens": 10, "temperature": 0.0}

  async def main(engine):
    before = await engine.generate(PROMPTS[0], greedy)
    body = await engine.update_weights_from_disk(served["other_dir"], weight_version=7)
    info = await engine.get_model_info()
    after = await engine.generate(PROMPTS[0], greedy)
    await engine.update_weights_from_disk(served["model_dir"])  # no version given: the engine bumps it
    restored = await engine.generate(PROMPTS[0], greedy)
    return before, body, info, after, restored

  before, body, info, after, restored = run(main, served["url"])
  assert body["success"] and info["weight_version"] == "7" and info["model_path"] == served["other_dir"]
  # The update's two parts, on the engine's clock (the publication benchmark reads them).
  assert info["stats"]["last_update_load_s"] > 0 and info["stats"]["last_update_swap_s"] >= 0
  assert after.weight_version == "7" and before.weight_version != "7"
  assert after.token_ids != before.token_ids
  np.testing.assert_allclose(after.logprobs, rescored(served["other_dir"], PROMPTS[0], after.token_ids, 1.0),
                             atol=2e-5)
  assert restored.weight_version == "8" and restored.token_ids == before.token_ids


def test_bad_requests_get_400_and_their_batch_mates_are_served(served):
  """The bug report: top_k / a stop id of 2**40 overflowed int32 in the batched sampler and failed all 8 valid
  batch-mates (500); 1e400, 2**70 and NaN gave 500 or invalid JSON. Now each is a 400 naming the field."""
  greedy = {"max_new_tokens": 4, "temperature": 0.0}
  bad_params = [({"top_k": 2**40}, "sampling_params.top_k"), ({"stop_token_ids": [2**40]}, "sampling_params.stop"),
                ({"temperature": -1.0}, "sampling_params.temperature"), ({"top_p": 0}, "sampling_params.top_p")]
  raw = [('{"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1e400}}', "sampling_params.max_new_tokens"),
         ('{"input_ids": [1, 1180591620717411303424]}', "input_ids: token id 1180591620717411303424"),
         ('{"input_ids": [1, 2], "sampling_params": {"temperature": NaN}}', "sampling_params.temperature")]

  async def post_raw(engine, body):
    async with engine._get_session().post(engine.base_url + "/generate", data=body,
                                           headers={"Content-Type": "application/json"}) as resp:
      return resp.status, await resp.json()

  async def main(engine):
    before = (await engine.get_model_info())["stats"]
    valid = [engine.generate(PROMPTS[i % len(PROMPTS)], greedy) for i in range(8)]
    invalid = [engine.generate(PROMPTS[0], {**greedy, **p}) for p, _ in bad_params]
    outcomes = await asyncio.gather(*valid, *invalid, *(post_raw(engine, b) for b, _ in raw),
                                    return_exceptions=True)
    return before, outcomes, (await engine.get_model_info())["stats"]

  before, outcomes, after = run(main, served["url"], max_retries=0)
  for result in outcomes[:8]:
    assert not isinstance(result, BaseException), result
    assert 1 <= len(result.token_ids) <= 4 and len(result.logprobs) == len(result.token_ids)
  for (_, field), e in zip(bad_params, outcomes[8:12]):
    assert isinstance(e, EngineError) and e.status == 400 and e.message.startswith(field), (field, e)
  for (_, field), (status, body) in zip(raw, outcomes[12:]):
    assert status == 400 and body["error"]["message"].startswith(field), (field, body)
  assert after["rows"] - before["rows"] == 8 and after["failed_rows"] == before["failed_rows"]
