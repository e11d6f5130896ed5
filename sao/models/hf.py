"""HF safetensors checkpoints ↔ our param trees, without torch.

One table, `RULES`, maps HF tensor names to param paths. `{name}` placeholders match the regex in `_GROUPS` and are
carried across. Our linear kernels are stored in HF's layout (`sao.models.layers.PARAM_LAYOUT`), so every transform
but CONV keeps the bytes and their order (a reshape; exports and loads copy, never transpose):
  COPY    same array (embeddings, norm scales, o_proj bias)
  FLAT    HF 1-D bias `[H·D]` ↔ ours `[H, D]`
  LINEAR  HF `nn.Linear` weight `[out, in]` ↔ our kernel `[out..., in]` (the out dims split)
  LINEAR2 same with two input dims (o_proj: ours `[E, H, D]` ↔ HF `[E, H·D]`)
  EXPERT  HF per-expert weight `experts.{e}.*.weight [out, in]` ↔ slice e of our stacked `[X, out, in]`
  CONV    HF depthwise `conv1d.weight [C, 1, K]` ↔ ours `[K, C]` (a transpose; K·C elements, K = 4)

Hybrid checkpoints (qwen3_next / qwen3_5): `linear_attn.*` tensors, `mlp.shared_expert*`. Multimodal `qwen3_5` /
`qwen3_5_moe` checkpoints keep the language model under `model.language_model.*` (read as `model.*`); their vision
tower (`model.visual.*`) and multi-token-prediction head (`mtp.*`) are skipped with one log line. Experts may also
be stored fused (`mlp.experts.gate_up_proj [X, 2·I, E]`, `mlp.experts.down_proj [X, E, I]`, the layout of
transformers ≥ 5); `save_pretrained` writes the per-expert layout, which transformers reads back.

Critic checkpoints are the policy layout without `lm_head.weight` plus the value head:
  `score.weight [1, E]` ↔ `value_head/kernel [1, E]`, `score.bias [1]` ↔ `value_head/bias [1]`
(the name `score` follows HF's `*ForTokenClassification` / reward-model heads).
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Iterator

import flax.linen as nn
import jax
import ml_dtypes
import numpy as np
import safetensors
import safetensors.numpy

from absl import logging

from sao.models.config import ModelConfig
from sao.models.transformer import abstract_params

COPY, FLAT, LINEAR, LINEAR2, EXPERT, CONV = "copy", "flat", "linear", "linear2", "expert", "conv"

_GROUPS = {
    "layer": r"\d+",
    "expert": r"\d+",
    "norm": r"input_layernorm|post_attention_layernorm",
    "qk_norm": r"q_norm|k_norm",
    "qkv": r"q_proj|k_proj|v_proj",
    "mlp": r"gate_proj|up_proj|down_proj",
    "lin_proj": r"in_proj_qkvz|in_proj_ba|in_proj_qkv|in_proj_z|in_proj_b|in_proj_a|out_proj",
    "lin_vec": r"A_log|dt_bias",
}
# Checkpoint name prefixes: the language model of a multimodal wrapper is read as a causal LM; parts we do not model
# are skipped (and logged).
_PREFIX_ALIASES = (("model.language_model.", "model."),)
_SKIPPED_PREFIXES = ("model.visual.", "mtp.")
_FUSED_EXPERTS = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")

RULES: tuple[tuple[str, str, str], ...] = (
  # HF tensor name                                          param path                                        transform
  ("model.embed_tokens.weight",                              "model/embed_tokens/embedding",                   COPY),
  ("model.norm.weight",                                      "model/norm/scale",                               COPY),
  ("lm_head.weight",                                         "lm_head/kernel",                                 LINEAR),
  ("score.weight",                                           "value_head/kernel",                              LINEAR),
  ("score.bias",                                             "value_head/bias",                                COPY),
  ("model.layers.{layer}.{norm}.weight",                     "model/layers_{layer}/{norm}/scale",              COPY),
  ("model.layers.{layer}.self_attn.{qk_norm}.weight",        "model/layers_{layer}/self_attn/{qk_norm}/scale", COPY),
  ("model.layers.{layer}.self_attn.{qkv}.weight",            "model/layers_{layer}/self_attn/{qkv}/kernel",    LINEAR),
  ("model.layers.{layer}.self_attn.{qkv}.bias",              "model/layers_{layer}/self_attn/{qkv}/bias",      FLAT),
  ("model.layers.{layer}.self_attn.o_proj.weight",           "model/layers_{layer}/self_attn/o_proj/kernel",   LINEAR2),
  ("model.layers.{layer}.self_attn.o_proj.bias",             "model/layers_{layer}/self_attn/o_proj/bias",     COPY),
  ("model.layers.{layer}.mlp.{mlp}.weight",                  "model/layers_{layer}/mlp/{mlp}/kernel",          LINEAR),
  ("model.layers.{layer}.mlp.{mlp}.bias",                    "model/layers_{layer}/mlp/{mlp}/bias",            COPY),
  ("model.layers.{layer}.mlp.gate.weight",                   "model/layers_{layer}/mlp/gate/kernel",           LINEAR),
  ("model.layers.{layer}.mlp.experts.{expert}.{mlp}.weight", "model/layers_{layer}/mlp/experts/{mlp}",         EXPERT),
  ("model.layers.{layer}.mlp.shared_expert.{mlp}.weight",
   "model/layers_{layer}/mlp/shared_expert/{mlp}/kernel",                                                      LINEAR),
  ("model.layers.{layer}.mlp.shared_expert_gate.weight",
   "model/layers_{layer}/mlp/shared_expert_gate/kernel",                                                       LINEAR),
  ("model.layers.{layer}.linear_attn.{lin_proj}.weight",
   "model/layers_{layer}/linear_attn/{lin_proj}/kernel",                                                       LINEAR),
  ("model.layers.{layer}.linear_attn.conv1d.weight",         "model/layers_{layer}/linear_attn/conv1d",        CONV),
  ("model.layers.{layer}.linear_attn.{lin_vec}",             "model/layers_{layer}/linear_attn/{lin_vec}",     COPY),
  ("model.layers.{layer}.linear_attn.norm.weight",           "model/layers_{layer}/linear_attn/norm/scale",    COPY),
)


def _template_regex(template: str) -> re.Pattern:
  parts = re.split(r"\{(\w+)\}", template)  # literal, group, literal, group, ...
  regex = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>{_GROUPS[p]})" for i, p in enumerate(parts))
  return re.compile(regex + "$")


_HF_REGEX = [(_template_regex(hf), hf, path, kind) for hf, path, kind in RULES]
_PATH_REGEX = [(_template_regex(path), hf, path, kind) for hf, path, kind in RULES]


def hf_to_path(name: str) -> tuple[str, str, int | None] | None:
  """HF tensor name → (param path, transform, expert index or None); None if no rule matches."""
  for regex, _, path, kind in _HF_REGEX:
    match = regex.match(name)
    if match:
      groups = match.groupdict()
      return path.format(**groups), kind, int(groups["expert"]) if "expert" in groups else None
  return None


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
  out = {}
  for key, value in tree.items():
    path = f"{prefix}/{key}" if prefix else key
    if isinstance(value, dict):
      out.update(_flatten(value, path))
    else:
      out[path] = value
  return out


def _unflatten(flat: dict[str, Any]) -> dict:
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    *parents, leaf = path.split("/")
    for key in parents:
      node = node.setdefault(key, {})
    node[leaf] = value
  return tree


def _hf_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  """The HF tensor shape that maps onto a param of `shape` (EXPERT: one expert's slice)."""
  if kind == FLAT:
    return (int(np.prod(shape)),)
  if kind == LINEAR:
    return (int(np.prod(shape[:-1])), shape[-1])
  if kind == LINEAR2:
    return (shape[0], int(np.prod(shape[1:])))
  if kind == EXPERT:
    return (shape[1], shape[2])
  if kind == CONV:
    return (shape[1], 1, shape[0])
  return tuple(shape)


def _to_ours(w: np.ndarray, kind: str, shape: tuple[int, ...]) -> np.ndarray:
  if kind == CONV:
    w = w[:, 0, :].T
  return w.reshape(shape)


def _to_hf(p: np.ndarray, kind: str) -> np.ndarray:
  if kind == CONV:
    return p.T[:, None, :]
  if kind == FLAT:
    return p.reshape(-1)
  if kind == LINEAR:
    return p.reshape(-1, p.shape[-1])
  if kind == LINEAR2:
    return p.reshape(p.shape[0], -1)
  return p


def _path_to_hf_name(path: str) -> str:
  for regex, hf, _, kind in _PATH_REGEX:
    match = regex.match(path)
    if match:
      groups = match.groupdict()
      return hf.format(expert="*", **groups) if kind == EXPERT else hf.format(**groups)
  return "?"


# ------------------------------------------------------------------------------------------------ loading
def _safetensors_files(directory: str) -> list[str]:
  index = os.path.join(directory, "model.safetensors.index.json")
  if os.path.exists(index):
    with open(index) as f:
      weight_map = json.load(f).get("weight_map")
    if not isinstance(weight_map, dict):
      raise ValueError(f"model.safetensors.index.json: missing 'weight_map' in {directory}")
    return [os.path.join(directory, name) for name in sorted(set(weight_map.values()))]
  files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
  if not files:
    raise ValueError(f"*.safetensors: no weight files in {directory}")
  return [os.path.join(directory, f) for f in files]


def _iter_tensors(directory: str) -> Iterator[tuple[str, np.ndarray]]:
  """(name, array) of every tensor we model, names normalised (`_PREFIX_ALIASES`); logs what is skipped."""
  skipped: dict[str, int] = {}
  for path in _safetensors_files(directory):
    with safetensors.safe_open(path, framework="np") as f:
      for name in f.keys():
        prefix = next((p for p in _SKIPPED_PREFIXES if name.startswith(p)), None)
        if prefix is not None:
          skipped[prefix] = skipped.get(prefix, 0) + 1
          continue
        hf_name = name
        for alias, canonical in _PREFIX_ALIASES:
          if name.startswith(alias):
            hf_name = canonical + name[len(alias):]
        yield hf_name, f.get_tensor(name)
  if skipped:
    logging.info("%s: skipped %s (not part of the language model)", directory,
                 ", ".join(f"{n} tensors {p}*" for p, n in sorted(skipped.items())))


def _split_fused_experts(name: str, w: np.ndarray) -> list[tuple[str, np.ndarray]] | None:
  """Fused expert tensors → per-expert HF names: gate_up_proj [X, 2I, E] = [gate | up] rows; down_proj [X, E, I]."""
  match = _FUSED_EXPERTS.match(name)
  if match is None:
    return None
  layer, kind = match.groups()
  base = f"model.layers.{layer}.mlp.experts"
  if kind == "down_proj":
    return [(f"{base}.{e}.down_proj.weight", w[e]) for e in range(w.shape[0])]
  half = w.shape[1] // 2
  return ([(f"{base}.{e}.gate_proj.weight", w[e, :half]) for e in range(w.shape[0])]
          + [(f"{base}.{e}.up_proj.weight", w[e, half:]) for e in range(w.shape[0])])


def load_pretrained(directory: str, dtype: str = "float32", critic: bool = False,
                    **config_overrides) -> tuple[ModelConfig, dict]:
  """Reads `config.json` + `*.safetensors` (single file or sharded with `model.safetensors.index.json`).

  `dtype` sets both the param and compute dtype ("float32" / "bfloat16"; `config_overrides` may set them apart).
  `critic=True` expects a critic checkpoint (`score.*`, no `lm_head`). Returns (config, params) with params as host
  numpy-backed jax arrays in `abstract_params(config, critic)`'s tree. Raises ValueError naming unknown, missing or
  mis-shaped tensors. This holds the whole model on the host; `sao.models.streaming.load_pretrained_sharded` loads
  the same params tensor by tensor straight into (sharded) device arrays.
  """
  overrides = {"dtype": dtype, "param_dtype": dtype, **config_overrides}
  config = ModelConfig.from_pretrained(directory, **overrides)
  expected = {path: leaf.shape for path, leaf in _flatten(nn.meta.unbox(abstract_params(config, critic))).items()}
  param_dtype = np.dtype(ml_dtypes.bfloat16) if config.param_dtype == "bfloat16" else np.dtype(np.float32)
  params: dict[str, np.ndarray] = {}
  experts_seen: dict[str, set[int]] = {}
  unknown = []
  tensors = ((n, a) for name, w in _iter_tensors(directory) for n, a in (_split_fused_experts(name, w) or [(name, w)]))
  for name, w in tensors:
    if name == "lm_head.weight" and config.tie_word_embeddings and not critic:
      continue  # some tied checkpoints still store the (identical) head
    found = hf_to_path(name)
    if found is None or found[0] not in expected:
      unknown.append(name)
      continue
    path, kind, expert = found
    shape = expected[path]
    if kind == EXPERT:
      if expert >= shape[0]:
        unknown.append(name)
        continue
      if w.shape != _hf_shape(kind, shape):
        raise ValueError(f"{name}: shape {w.shape}, expected {_hf_shape(kind, shape)} for param {path}")
      params.setdefault(path, np.zeros(shape, param_dtype))[expert] = w.astype(param_dtype)
      experts_seen.setdefault(path, set()).add(expert)
      continue
    if w.shape != _hf_shape(kind, shape):
      raise ValueError(f"{name}: shape {w.shape}, expected {_hf_shape(kind, shape)} for param {path}")
    params[path] = _to_ours(w, kind, shape).astype(param_dtype)
  missing = [f"{p} (HF {_path_to_hf_name(p)})" for p in sorted(expected) if p not in params]
  for path, seen in experts_seen.items():
    missing += [f"{path}[expert {e}]" for e in range(expected[path][0]) if e not in seen]
  if unknown or missing:
    raise ValueError(f"{directory} does not fit {config.model_type} (critic={critic}): "
                     f"unknown tensors {sorted(unknown)}; missing params {missing}")
  return config, jax.tree.map(jax.numpy.asarray, _unflatten(params))


# ------------------------------------------------------------------------------------------------ saving
def _path_rule(path: str) -> tuple[str, str, dict[str, str]]:
  """(HF name template, transform, placeholder values) of a param path; raises ValueError if it has no HF name."""
  for regex, hf, _, kind in _PATH_REGEX:
    match = regex.match(path)
    if match is not None:
      return hf, kind, match.groupdict()
  raise ValueError(f"{path}: no HF name for this param")


def hf_tensor_specs(path: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
  """(HF name, HF shape) of every tensor a param of `shape` at `path` becomes (EXPERT: one per expert), without
  its values — what an exporter needs to lay out safetensors files before any tensor is gathered."""
  hf, kind, groups = _path_rule(path)
  if kind == EXPERT:
    return [(hf.format(expert=e, **groups), _hf_shape(kind, tuple(shape))) for e in range(shape[0])]
  return [(hf.format(**groups), _hf_shape(kind, tuple(shape)))]


def param_to_hf(path: str, array: np.ndarray) -> list[tuple[str, np.ndarray]]:
  """The HF tensors (name, contiguous numpy array, same dtype) of one param, in `hf_tensor_specs` order."""
  hf, kind, groups = _path_rule(path)
  if kind == EXPERT:
    return [(hf.format(expert=e, **groups), np.ascontiguousarray(array[e])) for e in range(array.shape[0])]
  return [(hf.format(**groups), np.ascontiguousarray(_to_hf(array, kind)))]


def flat_params(params: dict) -> dict[str, Any]:
  """A policy or critic param tree as `{"model/layers_0/...": leaf}` (the paths `param_to_hf` takes)."""
  return _flatten(nn.meta.unbox(params))


def to_hf_tensors(params: dict) -> dict[str, np.ndarray]:
  """Flattens a policy or critic param tree into HF tensor names (numpy, same dtype)."""
  out = {}
  for path, value in flat_params(params).items():
    out.update(param_to_hf(path, np.asarray(jax.device_get(value))))
  return out


def hf_config_json(config: ModelConfig, tensor_dtypes: set[str], critic: bool) -> dict[str, Any]:
  """The `config.json` dict of a checkpoint whose tensors have `tensor_dtypes` (numpy names)."""
  hf = config.to_hf()
  hf["torch_dtype"] = "bfloat16" if tensor_dtypes == {"bfloat16"} else "float32"
  if critic:
    hf["sao_critic"] = True  # informational; `architectures` stays the backbone's
  return hf


def save_pretrained(config: ModelConfig, params: dict, directory: str,
                    max_shard_bytes: int = 4 * 1024 ** 3) -> None:
  """Writes `config.json` + safetensors (sharded with `model.safetensors.index.json` above `max_shard_bytes`).

  A policy directory loads with `transformers.AutoModelForCausalLM.from_pretrained`; a critic directory (params with
  `value_head`) stores the backbone + `score.weight`/`score.bias` and loads with `load_pretrained(critic=True)`.
  The checkpoint dtype is the params' dtype.
  """
  tensors = to_hf_tensors(params)
  os.makedirs(directory, exist_ok=True)
  hf = hf_config_json(config, {str(t.dtype) for t in tensors.values()}, critic="score.weight" in tensors)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(hf, f, indent=2, sort_keys=True)
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name in sorted(tensors):
    nbytes = tensors[name].nbytes
    if shards[-1] and size + nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = tensors[name]
    size += nbytes
  metadata = {"format": "pt"}  # transformers refuses safetensors without a known format tag
  if len(shards) == 1:
    safetensors.numpy.save_file(shards[0], os.path.join(directory, "model.safetensors"), metadata=metadata)
    return
  weight_map = {}
  for i, shard in enumerate(shards):
    filename = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    safetensors.numpy.save_file(shard, os.path.join(directory, filename), metadata=metadata)
    weight_map.update({name: filename for name in shard})
  total = sum(t.nbytes for t in tensors.values())
  with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
