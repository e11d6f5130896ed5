"""Engine edges: sampling parameters checked in the dtype the sampler uses, any malformed JSON body a JSON 400, and
a checkpoint with non-finite weights refused with 400 while the old weights keep serving."""
from __future__ import annotations

import asyncio
import os

import aiohttp
import numpy as np
import pytest

from sao.engines.request_checks import RequestError, RowLimits, check_row
from tests.engines.helpers import save_tiny_model
from tests.engines.test_engine_isolation import make_engine, post, serve

LIMITS = RowLimits(vocab_size=300, context_length=64, max_new_tokens_cap=16, max_stop_ids=4, eos_ids=(2,))


def test_top_p_is_checked_in_float32():
  for top_p in (1e-40, 1e-39, 5e-324):  # > 0 as Python floats; 0 or subnormal in float32
    with pytest.raises(RequestError, match="sampling_params.top_p"):
      check_row("input_ids", [1, 2], {"top_p": top_p}, LIMITS)
  assert check_row("input_ids", [1, 2], {"top_p": 1.2e-38}, LIMITS)[1].top_p == 1.2e-38
  assert check_row("input_ids", [1, 2], {"top_p": 1.0}, LIMITS)[1].top_p == 1.0


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("edges")
  good = save_tiny_model(str(root / "good"))
  bad = save_tiny_model(str(root / "nan"))
  # The same shapes, every weight of one tensor NaN: rewrite the safetensors file in place.
  from safetensors.numpy import load_file, save_file
  [name] = [f for f in os.listdir(bad) if f.endswith(".safetensors")]
  tensors = load_file(os.path.join(bad, name))
  first = sorted(tensors)[0]
  tensors[first] = np.full_like(tensors[first], np.nan)
  save_file(tensors, os.path.join(bad, name))
  return good, bad


def test_malformed_json_and_a_non_finite_checkpoint_get_json_400s(model_dirs):
  good, bad = model_dirs
  engine, sampler = make_engine(good, max_batch_size=1)

  async def main():
    runner, url = await serve(engine)
    try:
      async with aiohttp.ClientSession() as http:
        nested = await post(http, url, "[" * 200_000 + "]" * 200_000)
        async with http.post(url + "/update_weights_from_disk", json={"model_path": bad}) as resp:
          refused = resp.status, await resp.json()
        served = await post(http, url, '{"input_ids": [1, 5], "sampling_params": {"max_new_tokens": 2}}')
        return nested, refused, served
    finally:
      await runner.cleanup()

  (status, body), refused, served = asyncio.run(main())
  assert status == 400 and "nested too deeply" in body["error"]["message"], body
  assert refused[0] == 400 and not refused[1]["success"] and "non-finite" in refused[1]["message"], refused
  assert served[0] == 200 and engine.model_path == good and engine.stats["weight_updates"] == 0
  assert served[1]["output_ids"] == [5, 5]  # still answered (the stand-in sampler echoes the last id)


def test_non_finite_params_names_the_tensors():
  from sao.engines.local_engine import non_finite_params
  params = {"a": np.ones((2, 2), np.float32), "b": {"c": np.array([1.0, np.inf], np.float32)},
            "d": np.array([np.nan], np.float32)}
  assert non_finite_params(params) == ["['b']['c']", "['d']"]
  assert non_finite_params({"a": np.zeros(3, np.float32)}) == []
