"""GGUF → HF conversion of SmolLM2-135M-Instruct: config, tensors, tokenizer, and a real chat answer."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from sao.models import gguf as gguf_convert
from sao.models.tokenizer import Tokenizer

ENCODE_TEXTS = [
    "What is the capital of France?",
    "Prices: 1234.56 and 7,890 -- in 2024.",
    "  two leading spaces,\ttabs\nand newlines\n\n",
    "unicode: naïve café, 日本語, emoji 🎉🚀, math ∑ ∫",
    "def f(x):\n    return x ** 2  # square\n",
    "<|im_start|>user\nhi<|im_end|>\n",
]


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_dir):
  return transformers.AutoTokenizer.from_pretrained(smollm2_dir)


def test_config_matches_the_reference(smollm2_dir):
  with open(os.path.join(smollm2_dir, "config.json"), encoding="utf-8") as f:
    config = json.load(f)
  expected = {
      "model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30, "hidden_size": 576,
      "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536,
      "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "vocab_size": 49152, "tie_word_embeddings": True,
      "bos_token_id": 1, "eos_token_id": 2, "max_position_embeddings": 8192,
  }
  assert {k: config[k] for k in expected} == expected
  with open(os.path.join(smollm2_dir, "generation_config.json"), encoding="utf-8") as f:
    assert json.load(f)["eos_token_id"] == 2


def test_tensors_have_hf_names_and_shapes(smollm2_dir):
  tensors = safetensors.numpy.load_file(os.path.join(smollm2_dir, "model.safetensors"))
  assert len(tensors) == 2 + 30 * 9  # embedding, final norm; 9 per layer; no lm_head (tied)
  assert tensors["model.embed_tokens.weight"].shape == (49152, 576)
  assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (576, 576)
  assert tensors["model.layers.29.self_attn.k_proj.weight"].shape == (192, 576)
  assert tensors["model.layers.0.mlp.down_proj.weight"].shape == (576, 1536)
  assert all(t.dtype == np.float32 and np.isfinite(t).all() for t in tensors.values())


def test_tensor_name_mapping():
  assert gguf_convert.hf_tensor_name("blk.12.ffn_gate.weight") == "model.layers.12.mlp.gate_proj.weight"
  assert gguf_convert.hf_tensor_name("blk.0.attn_q.bias") == "model.layers.0.self_attn.q_proj.bias"
  assert gguf_convert.hf_tensor_name("output.weight") == "lm_head.weight"
  with pytest.raises(KeyError, match="blk.0.attn_qkv.weight"):
    gguf_convert.hf_tensor_name("blk.0.attn_qkv.weight")


def test_unpermute_inverts_llama_cpp_permutation():
  rng = np.random.default_rng(0)
  for n_heads, head_dim in ((9, 64), (3, 8)):
    w = rng.normal(size=(n_heads * head_dim, 16)).astype(np.float32)
    # llama.cpp's converter: within each head, interleave the two rotary halves.
    permuted = w.reshape(n_heads, 2, head_dim // 2, 16).swapaxes(1, 2).reshape(w.shape)
    np.testing.assert_array_equal(gguf_convert.unpermute_rotary(permuted, n_heads), w)
    bias = w[:, 0]
    np.testing.assert_array_equal(
        gguf_convert.unpermute_rotary(bias.reshape(n_heads, 2, -1).swapaxes(1, 2).reshape(-1), n_heads), bias)


def test_missing_file_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.gguf"):
    gguf_convert.convert_gguf_to_hf(str(tmp_path / "nope.gguf"), str(tmp_path / "out"))


def test_our_tokenizer_encodes_like_transformers(smollm2_dir, hf_tokenizer):
  ours = Tokenizer.from_pretrained(smollm2_dir)
  assert ours.vocab_size == len(hf_tokenizer) == 49152
  for text in ENCODE_TEXTS:
    ids = ours.encode(text)
    assert ids == hf_tokenizer.encode(text, add_special_tokens=False), text
    assert ours.decode(ids) == text
  # SmolLM2's pre-tokenizer spells numbers digit by digit.
  assert [ours.decode([i]) for i in ours.encode("2024")] == ["2", "0", "2", "4"]
  assert ours.encode("<|im_start|>") == [1]


def test_transformers_answers_paris(smollm2_dir, hf_tokenizer):
  """The converted checkpoint is the real model: transformers' greedy chat answer names Paris."""
  model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
  ids = Tokenizer.from_pretrained(smollm2_dir).apply_chat_template(
      [{"role": "user", "content": "What is the capital of France?"}])
  assert ids == list(hf_tokenizer.apply_chat_template(
      [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True,
      return_dict=False))
  with torch.no_grad():
    out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
  answer = hf_tokenizer.decode(out[0, len(ids):])
  assert "Paris" in answer, answer


def test_cli_rejects_missing_arguments():
  with pytest.raises(SystemExit):
    gguf_convert.main(["--out=/tmp/never-written"])


@pytest.mark.slow  # ~45 s on 2 CPU cores, mostly jit compilation of the 30-layer decode loop
def test_sao_model_answers_paris(smollm2_dir):
  """End to end through our own stack: sao.models.hf loads the converted checkpoint, our tokenizer renders the chat,
  sao.models.sampling decodes greedily with a KV cache."""
  from sao.models import hf, sampling  # pylint: disable=g-import-not-at-top

  config, params = hf.load_pretrained(smollm2_dir, dtype="float32")
  tok = Tokenizer.from_pretrained(smollm2_dir)
  prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
  [completion] = sampling.generate(
      config, params, [prompt],
      sampling.SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=tok.eos_token_ids))
  answer = tok.decode(completion.token_ids)
  assert "Paris" in answer, answer
  assert np.all(np.isfinite(completion.logprobs)) and np.all(completion.logprobs <= 0)


def _llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
  """What llama.cpp's converter does to q/k rows (the inverse of `unpermute_rotary`)."""
  return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_tiny_gguf(path: str, hf: dict[str, np.ndarray], extra: dict[str, np.ndarray] | None = None) -> None:
  """A 2-layer llama GGUF (F32 tensors, untied head, 4 q / 2 kv heads of dim 4) with a byte-level BPE vocabulary."""
  import gguf  # pylint: disable=g-import-not-at-top
  from sao.models import toy_vocab  # pylint: disable=g-import-not-at-top

  table = toy_vocab._bytes_to_unicode()  # pylint: disable=protected-access
  tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [table[b] for b in range(256)] + ["ab", "Ġab"]
  writer = gguf.GGUFWriter(path, "llama")
  writer.add_block_count(2)
  writer.add_context_length(64)
  writer.add_embedding_length(16)
  writer.add_feed_forward_length(24)
  writer.add_head_count(4)
  writer.add_head_count_kv(2)
  writer.add_rope_freq_base(10000.0)
  writer.add_layer_norm_rms_eps(1e-6)
  writer.add_vocab_size(len(tokens))
  writer.add_tokenizer_model("gpt2")
  writer.add_tokenizer_pre("default")
  writer.add_token_list(tokens)
  writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
  writer.add_token_merges(["a b", "Ġ ab"])
  writer.add_bos_token_id(1)
  writer.add_eos_token_id(2)
  writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}")
  names = {v: k for k, v in gguf_convert._GLOBAL_TENSORS.items()}  # pylint: disable=protected-access
  layer_names = {v: k for k, v in gguf_convert._LAYER_TENSORS.items()}  # pylint: disable=protected-access
  for name, w in hf.items():
    if name.startswith("model.layers."):
      _, _, layer, rest = name.split(".", 3)
      kind = layer_names[rest.rsplit(".", 1)[0]]
      gname = f"blk.{layer}.{kind}.weight"
      w = _llama_cpp_permute(w, 4) if kind == "attn_q" else _llama_cpp_permute(w, 2) if kind == "attn_k" else w
    else:
      gname = names[name]
    writer.add_tensor(gname, np.ascontiguousarray(w))
  for gname, w in (extra or {}).items():
    writer.add_tensor(gname, w)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()


def _tiny_hf_tensors(vocab: int = 261) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(0)
  shapes = {"model.embed_tokens.weight": (vocab, 16), "model.norm.weight": (16,), "lm_head.weight": (vocab, 16)}
  for i in range(2):
    p = f"model.layers.{i}."
    shapes.update({p + "input_layernorm.weight": (16,), p + "post_attention_layernorm.weight": (16,),
                   p + "self_attn.q_proj.weight": (16, 16), p + "self_attn.k_proj.weight": (8, 16),
                   p + "self_attn.v_proj.weight": (8, 16), p + "self_attn.o_proj.weight": (16, 16),
                   p + "mlp.gate_proj.weight": (24, 16), p + "mlp.up_proj.weight": (24, 16),
                   p + "mlp.down_proj.weight": (16, 24)})
  return {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}


def test_tiny_gguf_round_trip(tmp_path):
  """A synthetic GGUF in llama.cpp's layout converts back to exactly the HF tensors it was made from."""
  hf = _tiny_hf_tensors()
  path = str(tmp_path / "tiny.gguf")
  _write_tiny_gguf(path, hf)
  out = gguf_convert.convert_gguf_to_hf(path, str(tmp_path / "hf"))
  got = safetensors.numpy.load_file(os.path.join(out, "model.safetensors"))
  assert sorted(got) == sorted(hf)
  for name, w in hf.items():
    np.testing.assert_array_equal(got[name], w, err_msg=name)
  with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
    config = json.load(f)
  assert config["tie_word_embeddings"] is False and config["head_dim"] == 4 and config["rms_norm_eps"] == 1e-6
  tok = Tokenizer.from_pretrained(out)
  assert tok.encode("ab ab<|im_end|>") == [259, 260, 2]
  assert tok.render_chat([{"role": "user", "content": "ab"}]) == "<|im_start|>ab<|im_end|>"
  assert tok.eos_token_ids == (2,) and tok.bos_token_id == 1
  # bfloat16 output: the same values, rounded.
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  out16 = gguf_convert.convert_gguf_to_hf(path, str(tmp_path / "hf16"), dtype="bfloat16")
  got16 = safetensors.numpy.load_file(os.path.join(out16, "model.safetensors"))
  assert got16["lm_head.weight"].dtype == ml_dtypes.bfloat16
  np.testing.assert_array_equal(got16["lm_head.weight"], hf["lm_head.weight"].astype(ml_dtypes.bfloat16))


def test_unmapped_gguf_tensor_is_an_error(tmp_path):
  path = str(tmp_path / "extra.gguf")
  _write_tiny_gguf(path, _tiny_hf_tensors(), extra={"blk.0.attn_qkv.weight": np.zeros((4, 4), np.float32)})
  with pytest.raises(KeyError, match="blk.0.attn_qkv.weight"):
    gguf_convert.convert_gguf_to_hf(path, str(tmp_path / "hf"))


def test_cached_conversion_converts_once(tmp_path, monkeypatch):
  """The first call converts, later calls (and other dtypes or a changed file) find their own directory; a losing
  concurrent conversion is discarded, never mixed into the winner's."""
  path = str(tmp_path / "tiny.gguf")
  _write_tiny_gguf(path, _tiny_hf_tensors())
  root = str(tmp_path / "cache")
  first = gguf_convert.cached_conversion(path, root)
  assert os.path.dirname(first) == os.path.join(root, "gguf") and os.path.basename(first).startswith("tiny-float32-")
  assert Tokenizer.from_pretrained(first).encode("ab") == [259]
  calls = []
  monkeypatch.setattr(gguf_convert, "convert_gguf_to_hf", lambda *a: calls.append(a))
  assert gguf_convert.cached_conversion(path, root) == first and not calls
  monkeypatch.undo()
  half = gguf_convert.cached_conversion(path, root, dtype="float16")
  assert half != first and os.path.isfile(os.path.join(half, "model.safetensors"))
  os.utime(path, ns=(0, 0))  # a changed file: a new conversion
  assert gguf_convert.cached_conversion(path, root) not in (first, half)
  with pytest.raises(ValueError, match="int8"):
    gguf_convert.cached_conversion(path, root, dtype="int8")
  with pytest.raises(FileNotFoundError, match="nope.gguf"):
    gguf_convert.cached_conversion(str(tmp_path / "nope.gguf"), root)


def test_cached_conversion_loses_a_race_cleanly(tmp_path, monkeypatch):
  path = str(tmp_path / "tiny.gguf")
  _write_tiny_gguf(path, _tiny_hf_tensors())
  root = str(tmp_path / "cache")
  convert = gguf_convert.convert_gguf_to_hf
  winner = {}

  def convert_while_another_process_wins(gguf_path, out_dir, dtype="float32"):
    target = out_dir.rsplit(".staging-", 1)[0]
    winner["dir"] = convert(gguf_path, target, dtype)  # the other process renames its conversion first
    return convert(gguf_path, out_dir, dtype)

  monkeypatch.setattr(gguf_convert, "convert_gguf_to_hf", convert_while_another_process_wins)
  assert gguf_convert.cached_conversion(path, root) == winner["dir"]
  assert os.listdir(os.path.join(root, "gguf")) == [os.path.basename(winner["dir"])]  # no staging directory left
