"""Linear weights in HF's `[out..., in...]` layout: an HF tensor and its param are the same bytes (export and load
copy, never transpose), the round trip HF → model → export → HF is bit-exact, and the model computes what it
computed in the earlier `[in, out]` layout (log-probs recorded from that tree)."""
from __future__ import annotations

import json
import os

import jax
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from sao.models import hf, streaming
from sao.models.config import ModelConfig
from sao.models.logprobs import token_logprobs
from sao.models.tokenizer import toy_tokenizer
from sao.models.transformer import abstract_params
from sao.train.export import export_policy

_LINEAR = (hf.LINEAR, hf.LINEAR2, hf.EXPERT)
_IDS = np.array([[0, 5, 17, 40, 41, 42, 7, 8, 9, 10, 11, 12]], np.int32)
# token_logprobs(temperature 0.7) of `_IDS` under `_write_hf_dir(config, seed=0)`, computed by the tree before
# this change (kernels [in, out], commit e4f743b). The layouts contract in another order, so the values agree to
# float32 rounding, not bit for bit.
_BEFORE = {
    "qwen3": [0.0, -6.769100189208984, -8.534520149230957, -3.8716800212860107, -8.08882999420166,
              -4.086480140686035, -8.707030296325684, -7.062270164489746, -7.716300010681152, -9.187089920043945,
              -12.088769912719727, -14.564550399780273],
    "qwen3_next": [0.0, -13.37343978881836, -26.453960418701172, -24.076839447021484, -7.402349948883057,
                   -8.295649528503418, -3.2796099185943604, -27.861040115356445, -13.204919815063477,
                   -14.407739639282227, -23.49151039123535, -9.542900085449219],
}


def _write_hf_dir(directory: str, config: ModelConfig, seed: int, dtype=np.float32) -> dict[str, np.ndarray]:
  """An HF checkpoint whose tensors are filled by HF name (sorted) from numpy's generator — independent of how our
  params are laid out — plus its config.json. Returns the tensors."""
  specs = []
  for path, leaf in hf.flat_params(abstract_params(config)).items():
    specs += hf.hf_tensor_specs(path, leaf.shape)
  rng = np.random.default_rng(seed)
  tensors = {}
  for name, shape in sorted(specs):
    noise = rng.standard_normal(shape).astype(np.float32)
    tensors[name] = (1.0 + 0.1 * noise if "norm" in name else 0.3 * noise).astype(dtype)
  os.makedirs(directory, exist_ok=True)
  safetensors.numpy.save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
    json.dump(hf.hf_config_json(config, {np.dtype(dtype).name}, False), f)
  return tensors


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3_moe", "qwen3_next", "llama"])
def test_linear_params_are_their_hf_tensors_reshaped(model_type):
  """Every linear param maps to its HF tensors without moving a byte: `param_to_hf` returns views of the param."""
  config = ModelConfig.tiny(model_type, vocab_size=64, tie_word_embeddings=model_type == "llama")
  for path, leaf in hf.flat_params(abstract_params(config)).items():
    kind = hf._path_rule(path)[1]  # pylint: disable=protected-access
    value = np.arange(np.prod(leaf.shape), dtype=np.float32).reshape(leaf.shape)
    tensors = hf.param_to_hf(path, value)
    if kind not in _LINEAR:
      continue
    for (name, tensor), (_, shape) in zip(tensors, hf.hf_tensor_specs(path, leaf.shape)):
      assert tensor.shape == shape and np.shares_memory(tensor, value), f"{path} → {name}: not a view"
    flat = np.concatenate([t.reshape(-1) for _, t in tensors])
    np.testing.assert_array_equal(flat, value.reshape(-1))  # same bytes, same order


@pytest.mark.parametrize("model_type,dtype", [("qwen2", np.float32), ("qwen3_moe", ml_dtypes.bfloat16),
                                              ("qwen3_next", np.float32)])
def test_hf_to_model_to_export_round_trip_is_bit_exact(tmp_path, model_type, dtype):
  """HF weights → `load_pretrained_sharded` → `export_policy`: every tensor comes back with the same bits (so the
  export equals the earlier layout's, which round-tripped exactly too); `load_pretrained` agrees leaf for leaf."""
  config = ModelConfig.tiny(model_type, vocab_size=toy_tokenizer().vocab_size)
  source = _write_hf_dir(str(tmp_path / "hf"), config, seed=1, dtype=dtype)
  dtype_name = "bfloat16" if dtype == ml_dtypes.bfloat16 else "float32"
  loaded_config, params = streaming.load_pretrained_sharded(str(tmp_path / "hf"), dtype=dtype_name)
  _, oracle = hf.load_pretrained(str(tmp_path / "hf"), dtype=dtype_name)
  for (path, got), want in zip(hf.flat_params(params).items(), hf.flat_params(oracle).values()):
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8), err_msg=path)
  out = export_policy(loaded_config, params, toy_tokenizer(), str(tmp_path / "export"))
  exported = safetensors.numpy.load_file(os.path.join(out, "model.safetensors"))
  assert sorted(exported) == sorted(source)
  for name, tensor in source.items():
    assert exported[name].dtype == tensor.dtype and exported[name].shape == tensor.shape, name
    assert exported[name].tobytes() == tensor.tobytes(), name


@pytest.mark.parametrize("model_type", sorted(_BEFORE))
def test_logprobs_equal_the_earlier_layouts(tmp_path, model_type):
  """The same HF checkpoint scores the same log-probs as the `[in, out]` layout did (values recorded from it)."""
  config = ModelConfig.tiny(model_type, vocab_size=64)
  _write_hf_dir(str(tmp_path), config, seed=0)
  loaded_config, params = hf.load_pretrained(str(tmp_path))
  lp = jax.jit(token_logprobs, static_argnames=("config",))(params, loaded_config, _IDS, None, 0.7)
  np.testing.assert_allclose(np.asarray(lp)[0], _BEFORE[model_type], rtol=1e-5, atol=1e-4)
