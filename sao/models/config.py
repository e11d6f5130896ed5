"""Model configuration: one frozen dataclass built from (and written back to) an HF `config.json`.

Supported HF `model_type`s: `llama`, `qwen2`, `qwen3`, `qwen3_moe`, and the hybrid family `qwen3_next`,
`qwen3_5_text`, `qwen3_5_moe_text` (plus the language model inside `qwen3_5` / `qwen3_5_moe` checkpoints, read from
their `text_config`). Every layer has a block type in `layer_types` ("full_attention" or "linear_attention" = Gated
DeltaNet), and an MLP kind derived from the MoE fields (`is_moe_layer(i)`).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
HYBRID_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
# Multimodal wrappers whose `text_config` is one of the hybrid types (their vision tower / MTP head are not loaded).
WRAPPER_TYPES = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}
LAYER_TYPES = ("full_attention", "linear_attention")
LINEAR_ATTN_FORMS = ("chunked", "recurrent")
LINEAR_ATTN_MATMULS = ("float32", "bfloat16")
MOE_IMPLS = ("routed", "dense")
DTYPES = ("float32", "bfloat16")
# Attention implementations (sao.models.attention): "auto" = splash on TPU, blockwise for long sequences, else xla.
ATTENTION_IMPLS = ("auto", "xla", "blockwise", "splash", "cudnn")
# Remat policies by name; values are attributes of `jax.checkpoint_policies` (None = save nothing = full remat).
REMAT_POLICIES = {
    "none": None,
    "full": "nothing_saveable",
    "dots_saveable": "dots_saveable",
    "dots_with_no_batch_dims_saveable": "dots_with_no_batch_dims_saveable",
}
_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture + numerics of a decoder-only LM.

  Attention: `num_heads` query heads and `num_kv_heads` key/value heads of size `head_dim` (GQA when they differ).
  Biases: `attention_bias` adds biases to q/k/v (qwen2: always), `attention_out_bias` to o_proj (llama/qwen3 with
  `attention_bias`). `qk_norm` applies RMSNorm over `head_dim` to q and k before RoPE (qwen3).
  MoE: layer i is sparse iff `num_experts > 0`, `i not in mlp_only_layers` and `(i + 1) % decoder_sparse_step == 0`;
  `shared_expert_intermediate_size > 0` adds a shared expert gated by `sigmoid(x @ shared_expert_gate)`.
  Hybrid (qwen3_next / qwen3_5): `attn_output_gate` (q_proj emits [q | gate] per head; output · sigmoid(gate)),
  `partial_rotary_factor` (RoPE on the first `int(head_dim · factor)` dims), `zero_centered_norm` (RMSNorm weight
  applied as 1 + w), and Gated DeltaNet blocks with `linear_num_key_heads` q/k heads of `linear_key_head_dim`,
  `linear_num_value_heads` v heads of `linear_value_head_dim`, a causal depthwise conv of `linear_conv_kernel_dim`,
  computed in `linear_attn_form` ("chunked": parallel within chunks of `linear_chunk_size`; "recurrent": one token
  at a time; a one-token step with a cache is always recurrent) with its matmuls in `linear_attn_matmul` ("float32":
  f32 at HIGHEST precision, the oracle; "bfloat16": bf16 operands, f32 accumulation, f32 state —
  `sao.models.gated_deltanet`).
  """
  model_type: str
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  max_position_embeddings: int = 32768
  attention_bias: bool = False
  attention_out_bias: bool = False
  mlp_bias: bool = False
  qk_norm: bool = False
  tie_word_embeddings: bool = False
  num_experts: int = 0
  num_experts_per_tok: int = 0
  moe_intermediate_size: int = 0
  norm_topk_prob: bool = False
  decoder_sparse_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()
  layer_types: tuple[str, ...] = ()
  shared_expert_intermediate_size: int = 0
  attn_output_gate: bool = False
  partial_rotary_factor: float = 1.0
  zero_centered_norm: bool = False
  linear_num_key_heads: int = 0
  linear_num_value_heads: int = 0
  linear_key_head_dim: int = 0
  linear_value_head_dim: int = 0
  linear_conv_kernel_dim: int = 4
  linear_chunk_size: int = 64  # ours: chunk length of the parallel Gated DeltaNet form
  linear_attn_form: str = "chunked"  # ours: "chunked" | "recurrent" (see the class docstring)
  linear_attn_matmul: str = "float32"  # ours: "float32" | "bfloat16", the chunked form's matmuls (class docstring)
  moe_impl: str = "routed"  # ours: "routed" (sorted, grouped matmuls) | "dense" (every expert, the oracle)
  # ours: > 0 under expert parallelism: a shard runs its sorted rows in chunks of this × its balanced share (one
  # chunk when they fit; sao.models.moe), nothing dropped. 0: every gathered row at once.
  moe_capacity_factor: float = 0.0
  bos_token_id: int | None = None
  eos_token_id: int | tuple[int, ...] | None = None
  dtype: str = "float32"  # compute dtype of activations
  param_dtype: str = "float32"  # storage dtype of parameters
  remat: str = "none"  # key of REMAT_POLICIES, applied per decoder layer
  # ours: run the decoder layers of cache-free calls (training, scoring) as a `lax.scan` over periods of layer kinds
  # (sao.models.scan); the param tree stays per layer. Compile time then stays that of one period, whatever the depth.
  scan_layers: bool = False
  # ours: under a mesh with `tensor` > 1, the residual stream and every projection's tokens split over `tensor`, the
  # mixers' heads reached by all-to-alls (sao.models.sequence_parallel); False: the hidden units split (sao.models.scan).
  sequence_parallel: bool = False
  attention_impl: str = "auto"  # ours: one of ATTENTION_IMPLS (sao.models.attention.resolve_impl)

  def __post_init__(self):
    if not self.layer_types:
      object.__setattr__(self, "layer_types", ("full_attention",) * self.num_layers)
    object.__setattr__(self, "layer_types", tuple(self.layer_types))
    object.__setattr__(self, "mlp_only_layers", tuple(int(i) for i in self.mlp_only_layers))
    self.validate()

  # ---------------------------------------------------------------- validation
  def validate(self) -> None:
    """Raises ValueError naming the first offending field."""
    if self.model_type not in MODEL_TYPES:
      raise ValueError(f"model_type: unsupported {self.model_type!r}; expected one of {MODEL_TYPES}")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                 "head_dim", "decoder_sparse_step"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name}: must be a positive int, got {value!r}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_kv_heads: {self.num_kv_heads} must divide num_heads {self.num_heads}")
    if self.head_dim % 2:
      raise ValueError(f"head_dim: must be even for RoPE, got {self.head_dim}")
    if not self.rms_norm_eps > 0:
      raise ValueError(f"rms_norm_eps: must be > 0, got {self.rms_norm_eps!r}")
    if not self.rope_theta > 0:
      raise ValueError(f"rope_theta: must be > 0, got {self.rope_theta!r}")
    if len(self.layer_types) != self.num_layers:
      raise ValueError(f"layer_types: has {len(self.layer_types)} entries for num_layers={self.num_layers}")
    for i, kind in enumerate(self.layer_types):
      if kind not in LAYER_TYPES:
        raise ValueError(f"layer_types[{i}]: unsupported block type {kind!r}; expected one of {LAYER_TYPES}")
    if not 0 < self.partial_rotary_factor <= 1 or self.rotary_dim % 2:
      raise ValueError(f"partial_rotary_factor: {self.partial_rotary_factor} must be in (0, 1] and give an even "
                       f"rotary dim (got {self.rotary_dim} of head_dim {self.head_dim})")
    if "linear_attention" in self.layer_types:
      for name in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                   "linear_conv_kernel_dim", "linear_chunk_size"):
        value = getattr(self, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
          raise ValueError(f"{name}: must be a positive int for linear_attention layers, got {value!r}")
      if self.linear_num_value_heads % self.linear_num_key_heads:
        raise ValueError(f"linear_num_key_heads: {self.linear_num_key_heads} must divide linear_num_value_heads "
                         f"{self.linear_num_value_heads}")
    if self.moe_impl not in MOE_IMPLS:
      raise ValueError(f"moe_impl: unsupported {self.moe_impl!r}; expected one of {MOE_IMPLS}")
    if self.linear_attn_form not in LINEAR_ATTN_FORMS:
      raise ValueError(f"linear_attn_form: unsupported {self.linear_attn_form!r}; expected one of {LINEAR_ATTN_FORMS}")
    if self.linear_attn_matmul not in LINEAR_ATTN_MATMULS:
      raise ValueError(f"linear_attn_matmul: unsupported {self.linear_attn_matmul!r}; expected one of "
                       f"{LINEAR_ATTN_MATMULS}")
    if not self.moe_capacity_factor >= 0:
      raise ValueError(f"moe_capacity_factor: must be >= 0, got {self.moe_capacity_factor}")
    if self.shared_expert_intermediate_size < 0:
      raise ValueError(f"shared_expert_intermediate_size: must be >= 0, got {self.shared_expert_intermediate_size}")
    if self.num_experts < 0:
      raise ValueError(f"num_experts: must be >= 0, got {self.num_experts}")
    if self.num_experts:
      if not 0 < self.num_experts_per_tok <= self.num_experts:
        raise ValueError(f"num_experts_per_tok: must be in [1, num_experts={self.num_experts}], "
                         f"got {self.num_experts_per_tok}")
      if self.moe_intermediate_size <= 0:
        raise ValueError(f"moe_intermediate_size: must be > 0 for MoE, got {self.moe_intermediate_size}")
    for i in self.mlp_only_layers:
      if not 0 <= i < self.num_layers:
        raise ValueError(f"mlp_only_layers: layer {i} out of range [0, {self.num_layers})")
    if self.dtype not in DTYPES:
      raise ValueError(f"dtype: unsupported {self.dtype!r}; expected one of {DTYPES}")
    if self.param_dtype not in DTYPES:
      raise ValueError(f"param_dtype: unsupported {self.param_dtype!r}; expected one of {DTYPES}")
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"remat: unsupported {self.remat!r}; expected one of {tuple(REMAT_POLICIES)}")
    if not isinstance(self.scan_layers, bool):
      raise ValueError(f"scan_layers: must be a bool, got {self.scan_layers!r}")
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(f"attention_impl: unsupported {self.attention_impl!r}; expected one of {ATTENTION_IMPLS}")

  @property
  def rotary_dim(self) -> int:
    """Number of leading head dims that RoPE rotates (HF: `int(head_dim · partial_rotary_factor)`)."""
    return int(self.head_dim * self.partial_rotary_factor)

  @property
  def linear_fused_proj(self) -> bool:
    """qwen3_next stores the Gated DeltaNet input projections fused per key head (`in_proj_qkvz`, `in_proj_ba`)."""
    return self.model_type == "qwen3_next"

  def is_moe_layer(self, i: int) -> bool:
    return (self.num_experts > 0 and i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0)

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  # ---------------------------------------------------------------- HF interop
  @classmethod
  def from_hf(cls, hf: Mapping[str, Any], **overrides) -> "ModelConfig":
    """Builds a config from an HF `config.json` dict; `overrides` set our own fields (dtype, remat, ...)."""
    if not isinstance(hf, Mapping):
      raise ValueError(f"config: expected a dict, got {type(hf).__name__}")
    model_type = hf.get("model_type")
    if model_type in WRAPPER_TYPES:  # multimodal wrapper: the language model's config is `text_config`
      text = hf.get("text_config")
      if not isinstance(text, Mapping):
        raise ValueError(f"text_config: missing from the {model_type} config")
      text = dict(text)
      text.setdefault("model_type", WRAPPER_TYPES[model_type])
      if "tie_word_embeddings" in hf:
        text["tie_word_embeddings"] = hf["tie_word_embeddings"]
      return cls.from_hf(text, **overrides)
    if model_type not in MODEL_TYPES:
      raise ValueError(f"model_type: unsupported {model_type!r}; expected one of {MODEL_TYPES + tuple(WRAPPER_TYPES)}")
    hybrid = model_type in HYBRID_TYPES

    def req(key):
      if key not in hf:
        raise ValueError(f"{key}: missing from the {model_type} config")
      return hf[key]

    act = hf.get("hidden_act", "silu")
    if act != "silu":
      raise ValueError(f"hidden_act: only 'silu' is supported, got {act!r}")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if not isinstance(rope, Mapping):
      raise ValueError(f"rope_parameters: expected a dict, got {rope!r}")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
      raise ValueError(f"rope_parameters.rope_type: only 'default' RoPE is supported, got {rope_type!r}")
    rope_theta = hf.get("rope_theta", rope.get("rope_theta", 10000.0))
    # qwen3_5's `mrope_section` only matters for image/video positions: text positions are equal on all three axes,
    # which makes M-RoPE the plain RoPE below. HF defaults the hybrid family's partial rotary factor to 0.25.
    partial = float(rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25 if hybrid else 1.0)))
    if partial != 1.0 and not hybrid:
      raise ValueError("partial_rotary_factor: only full rotary embeddings are supported")

    num_heads = req("num_attention_heads")
    hidden = req("hidden_size")
    head_dim = hf.get("head_dim") or (hidden // num_heads if isinstance(hidden, int) and num_heads else None)
    num_layers = req("num_hidden_layers")
    layer_types = hf.get("layer_types") or ()
    if hybrid and not layer_types:
      interval = hf.get("full_attention_interval", 4)
      layer_types = tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention"
                          for i in range(num_layers))
    if model_type == "qwen2" and hf.get("use_sliding_window"):
      raise ValueError("use_sliding_window: sliding-window attention is not supported")
    if model_type == "qwen2":
      qkv_bias, out_bias = True, False  # Qwen2 hard-codes q/k/v biases and no o_proj bias
    else:
      qkv_bias = out_bias = bool(hf.get("attention_bias", False))
    moe = model_type in ("qwen3_moe", "qwen3_next", "qwen3_5_moe_text")
    sparse_fields = model_type in ("qwen3_moe", "qwen3_next")  # qwen3_5_moe: every layer is MoE
    num_experts = hf.get("num_experts", hf.get("num_local_experts", 0)) if moe else 0
    intermediate = hf.get("intermediate_size") if model_type == "qwen3_5_moe_text" else req("intermediate_size")
    if not intermediate:  # qwen3_5_moe has no dense MLP; the field is unused there
      intermediate = hf.get("shared_expert_intermediate_size") or hf.get("moe_intermediate_size")
    kwargs = dict(
        model_type=model_type,
        vocab_size=req("vocab_size"),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=head_dim,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope_theta),
        max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
        attention_bias=qkv_bias,
        attention_out_bias=out_bias,
        mlp_bias=bool(hf.get("mlp_bias", False)) if model_type == "llama" else False,
        qk_norm=model_type in ("qwen3", "qwen3_moe") or hybrid,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        num_experts=num_experts,
        num_experts_per_tok=hf.get("num_experts_per_tok", 0) if moe else 0,
        moe_intermediate_size=hf.get("moe_intermediate_size", 0) if moe else 0,
        norm_topk_prob=(bool(hf.get("norm_topk_prob", model_type == "qwen3_next")) if sparse_fields
                        else model_type == "qwen3_5_moe_text"),
        decoder_sparse_step=hf.get("decoder_sparse_step", 1) if sparse_fields else 1,
        mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()) if sparse_fields else (),
        layer_types=tuple(layer_types),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=tuple(hf["eos_token_id"]) if isinstance(hf.get("eos_token_id"), list) else hf.get("eos_token_id"),
    )
    if hybrid:
      kwargs.update(
          shared_expert_intermediate_size=hf.get("shared_expert_intermediate_size", 0) if num_experts else 0,
          attn_output_gate=True, partial_rotary_factor=partial, zero_centered_norm=True,
          linear_num_key_heads=hf.get("linear_num_key_heads", 16),
          linear_num_value_heads=hf.get("linear_num_value_heads", 32),
          linear_key_head_dim=hf.get("linear_key_head_dim", 128),
          linear_value_head_dim=hf.get("linear_value_head_dim", 128),
          linear_conv_kernel_dim=hf.get("linear_conv_kernel_dim", 4))
    # HF's `torch_dtype` / `dtype` is the checkpoint's storage dtype: a loading choice (`load_pretrained(dtype=...)`
    # or `overrides`), not architecture, so it is not read here.
    kwargs.update(overrides)
    return cls(**kwargs)

  @classmethod
  def from_pretrained(cls, directory: str, **overrides) -> "ModelConfig":
    path = os.path.join(directory, "config.json")
    if not os.path.exists(path):
      raise ValueError(f"config.json: not found in {directory}")
    with open(path) as f:
      return cls.from_hf(json.load(f), **overrides)

  def to_hf(self) -> dict[str, Any]:
    """An HF `config.json` dict that `transformers.AutoConfig` reads back into the same architecture."""
    hf: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[self.model_type]],
        "model_type": self.model_type,
        "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads,
        "head_dim": self.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": self.rms_norm_eps,
        "rope_theta": self.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
        "max_position_embeddings": self.max_position_embeddings,
        "tie_word_embeddings": self.tie_word_embeddings,
        "layer_types": list(self.layer_types),
        "bos_token_id": self.bos_token_id,
        "eos_token_id": list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id,
        "torch_dtype": self.param_dtype,
    }
    if self.model_type == "qwen2":
      if not (self.attention_bias and not self.attention_out_bias):
        raise ValueError("attention_bias: qwen2 requires q/k/v biases and no o_proj bias")
      hf["use_sliding_window"] = False
    else:
      if self.attention_bias != self.attention_out_bias:
        raise ValueError(f"attention_out_bias: {self.model_type} ties q/k/v and o_proj biases in HF")
      hf["attention_bias"] = self.attention_bias
    if self.model_type == "llama":
      hf["mlp_bias"] = self.mlp_bias
    hybrid = self.model_type in HYBRID_TYPES
    if hybrid != (self.attn_output_gate and self.zero_centered_norm and self.qk_norm):
      raise ValueError(f"attn_output_gate: {self.model_type} needs attn_output_gate = zero_centered_norm = qk_norm "
                       f"= {hybrid}")
    if not hybrid and ("linear_attention" in self.layer_types or self.shared_expert_intermediate_size
                       or self.partial_rotary_factor != 1.0):
      raise ValueError(f"layer_types: {self.model_type} has no linear attention, shared expert or partial RoPE")
    if self.model_type in ("qwen3_moe", "qwen3_next"):
      hf.update(num_experts=self.num_experts, num_experts_per_tok=self.num_experts_per_tok,
                moe_intermediate_size=self.moe_intermediate_size, norm_topk_prob=self.norm_topk_prob,
                decoder_sparse_step=self.decoder_sparse_step, mlp_only_layers=list(self.mlp_only_layers))
    if hybrid:
      hf["rope_parameters"]["partial_rotary_factor"] = self.partial_rotary_factor
      hf.update(linear_num_key_heads=self.linear_num_key_heads, linear_num_value_heads=self.linear_num_value_heads,
                linear_key_head_dim=self.linear_key_head_dim, linear_value_head_dim=self.linear_value_head_dim,
                linear_conv_kernel_dim=self.linear_conv_kernel_dim)
    if self.model_type == "qwen3_next":
      hf["shared_expert_intermediate_size"] = self.shared_expert_intermediate_size
    if self.model_type == "qwen3_5_text" and self.num_experts:
      raise ValueError("num_experts: qwen3_5_text is dense (use qwen3_5_moe_text)")
    if self.model_type == "qwen3_5_moe_text":
      if not (self.num_experts and self.norm_topk_prob and self.decoder_sparse_step == 1 and not self.mlp_only_layers):
        raise ValueError("num_experts: qwen3_5_moe_text has normalised top-k MoE in every layer")
      del hf["intermediate_size"]  # no dense MLP
      hf.update(num_experts=self.num_experts, num_experts_per_tok=self.num_experts_per_tok,
                moe_intermediate_size=self.moe_intermediate_size,
                shared_expert_intermediate_size=self.shared_expert_intermediate_size)
    return hf

  # ---------------------------------------------------------------- tests
  @classmethod
  def tiny(cls, model_type: str = "qwen3", **overrides) -> "ModelConfig":
    """A tiny config for tests: vocab 128, hidden 64, 2 layers, 4 q / 2 kv heads of 16, MoE 8 experts top-2.

    Hybrid types: layers [linear_attention, full_attention], Gated DeltaNet with 2 q/k heads of 16 and 4 v heads of 8,
    chunks of 8; qwen3_next / qwen3_5_moe_text add a shared expert of width 48.
    """
    kwargs: dict[str, Any] = dict(
        model_type=model_type, vocab_size=128, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=512)
    if model_type == "qwen2":
      kwargs.update(attention_bias=True)
    if model_type in ("qwen3", "qwen3_moe"):
      kwargs.update(qk_norm=True)
    if model_type == "qwen3_moe":
      kwargs.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)
    if model_type in HYBRID_TYPES:  # [linear, full] blocks; key/value head dims differ to catch transpositions
      kwargs.update(
          qk_norm=True, attn_output_gate=True, zero_centered_norm=True, partial_rotary_factor=0.25,
          layer_types=("linear_attention", "full_attention"), linear_num_key_heads=2, linear_num_value_heads=4,
          linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4, linear_chunk_size=8)
    if model_type in ("qwen3_next", "qwen3_5_moe_text"):
      kwargs.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                    shared_expert_intermediate_size=48)
    if model_type == "qwen3_5_moe_text":
      kwargs.update(intermediate_size=48)  # unused (no dense MLP); from_hf fills it with the shared expert width
    kwargs.update(overrides)
    return cls(**kwargs)
