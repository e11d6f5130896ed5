"""The local engine and the trainer's log-probs against answers recorded from a real SGLang server (sglang-jax
0.1.0rc0 on CPU, `fixtures/sglang_jax/parity.json`) for the same weights: a random Qwen3 rebuilt here from its seed
(`save_parity_model`), so CI needs neither the server nor the weights file.

- greedy `/generate`, one prompt and the batch form: the local engine returns the same tokens, and log-probs
  within `LOGPROB_ATOL` of SGLang's;
- sampled at temperature 0.5 (also with top-p 0.5 / top-k 5) and at 1 with top-k 3: SGLang's log-prob of each
  token it sampled is `sao.models.logprobs.token_logprobs` at the request's temperature, over the full vocabulary
  (before truncation), within `LOGPROB_ATOL` -- the log-prob the trainer computes for the same tokens, the meaning
  `sao.models.sampling` gives the local engine's log-probs. SGLang 0.5.23's torch sampler reports the same
  (`sglang/srt/layers/sampler.py`: `log(softmax(logits / T))` before top-p/top-k, `log_softmax(logits)` when greedy).

Re-recording (docs/fleet.md, "The SGLang contract", has the server's command line):
    python -m tests.engines.test_sglang_jax_parity --save_model=/tmp/sgl/parity_model
    (start sglang-jax on that directory, then)
    python -m tests.engines.test_sglang_jax_parity --record=http://127.0.0.1:31556
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import urllib.request

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao.engines.local_engine import EngineConfig, LocalEngine
from sao.engines.request_checks import check_generate_body
from sao.models.config import ModelConfig
from sao.models.hf import load_pretrained, save_pretrained
from sao.models.logprobs import token_logprobs
from sao.models.transformer import abstract_params

RECORDED = os.path.join(os.path.dirname(__file__), "fixtures", "sglang_jax", "parity.json")
# Two float32 implementations of the same forward pass (XLA CPU both, different op order): measured ≤ 1e-5 apart.
LOGPROB_ATOL = 2e-4
PROMPT = [5, 6, 7, 8, 9, 10]
REQUESTS = {
    "greedy": {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0.0}},
    "greedy_batch": {"input_ids": [PROMPT, [11, 12, 13]], "sampling_params": {"max_new_tokens": 5,
                                                                              "temperature": 0.0}},
    "t0.5": {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0.5}},
    "t0.5_top_p_top_k": {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0.5,
                                                                  "top_p": 0.5, "top_k": 5}},
    "t1_top_k": {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 1.0, "top_k": 3}},
}


def parity_config() -> ModelConfig:
  """Qwen3, vocab 1024, 2 layers, hidden 128, 2 heads of 128 (sglang-jax's CPU attention wants head_dim 128)."""
  return ModelConfig.tiny("qwen3", vocab_size=1024, num_layers=2, hidden_size=128, intermediate_size=256,
                          num_heads=2, num_kv_heads=2, head_dim=128, max_position_embeddings=512)


def save_parity_model(directory: str) -> str:
  """The recorded server's weights: numpy seed 0, std 0.3 (peaky enough that log-probs are far from uniform), norm
  scales 1 ± 0.1, in `abstract_params` order. No tokenizer (the server ran with --skip-tokenizer-init)."""
  rng = np.random.default_rng(0)

  def fill(path, leaf):
    noise = rng.standard_normal(leaf.shape).astype(np.float32)
    base = 1.0 + 0.1 * noise if "norm" in jax.tree_util.keystr(path) else 0.3 * noise
    return jnp.asarray(base, leaf.dtype)

  config = parity_config()
  save_pretrained(config, jax.tree_util.tree_map_with_path(fill, abstract_params(config)), directory)
  return directory


def _body(name: str) -> dict:
  return {**REQUESTS[name], "return_logprob": True}


@pytest.fixture(scope="module")
def recorded():
  with open(RECORDED) as f:
    return json.load(f)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  return save_parity_model(str(tmp_path_factory.mktemp("parity") / "model"))


def _ids_and_logprobs(item: dict) -> tuple[list[int], np.ndarray]:
  entries = item["meta_info"]["output_token_logprobs"]
  return [e[1] for e in entries], np.array([e[0] for e in entries], np.float64)


def test_local_engine_greedy_equals_sglang(model_dir, recorded):
  engine = LocalEngine(model_dir, EngineConfig(batch_window_ms=0, max_batch_size=2, prompt_buckets=(16,),
                                               batch_buckets=(2,), new_token_buckets=(8,), prefix_cache_bytes=0))

  names = ("greedy", "greedy_batch")

  async def run():
    await engine.start()
    try:
      return [await engine.generate(check_generate_body(_body(name), engine.limits)[1]) for name in names]
    finally:
      await engine.stop()

  for name, ours in zip(names, asyncio.run(run())):
    theirs = recorded[name] if isinstance(recorded[name], list) else [recorded[name]]
    assert len(ours) == len(theirs)
    for (completion, _), item in zip(ours, theirs):
      ids, logprobs = _ids_and_logprobs(item)
      assert completion.token_ids.tolist() == ids == item["output_ids"], name
      np.testing.assert_allclose(completion.logprobs, logprobs, atol=LOGPROB_ATOL, rtol=0, err_msg=name)


@pytest.mark.parametrize("name", ["t0.5", "t0.5_top_p_top_k", "t1_top_k"])
def test_sglang_sampled_logprobs_are_the_trainers(model_dir, recorded, name):
  config, params = load_pretrained(model_dir)
  ids, theirs = _ids_and_logprobs(recorded[name])
  seq = np.zeros((1, 16), np.int32)  # one padded shape: one compile for the three cases
  seq[0, :len(PROMPT) + len(ids)] = PROMPT + ids
  mask = (np.arange(16) < len(PROMPT) + len(ids)).astype(np.int32)[None]
  temperature = REQUESTS[name]["sampling_params"]["temperature"]
  ours = np.asarray(_score(params, config, seq, mask, temperature))[0, len(PROMPT):len(PROMPT) + len(ids)]
  np.testing.assert_allclose(ours, theirs, atol=LOGPROB_ATOL, rtol=0)
  # Not the untempered distribution's (which would also differ from what the engine samples from).
  if temperature != 1.0:
    untempered = np.asarray(_score(params, config, seq, mask, 1.0))[0, len(PROMPT):len(PROMPT) + len(ids)]
    assert np.abs(untempered - theirs).max() > 100 * LOGPROB_ATOL


_score = jax.jit(token_logprobs, static_argnames=("config",))


def record(url: str) -> None:
  """Sends `REQUESTS` to a running server and writes the bodies to `RECORDED`."""
  out = {}
  for name in REQUESTS:
    req = urllib.request.Request(url.rstrip("/") + "/generate", data=json.dumps(_body(name)).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
      out[name] = json.load(resp)
  with open(RECORDED, "w") as f:
    f.write(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
  parser = argparse.ArgumentParser()
  parser.add_argument("--save_model", help="write the parity model to this directory")
  parser.add_argument("--record", help="record the parity requests from the server at this URL")
  args = parser.parse_args()
  if args.save_model:
    save_parity_model(args.save_model)
  if args.record:
    record(args.record)
