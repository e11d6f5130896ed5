"""What a compiled program costs: FLOPs counted from its jaxpr, analytic model FLOPs, and HBM from XLA's dumps.

Why a jaxpr count beside XLA's `cost_analysis()`: XLA's HLO cost analysis counts a loop body once, whatever its
trip count (checked with libtpu 0.0.42.1: a `lax.scan` of 8 matmuls reports the FLOPs of one). The learner's
programs loop over micro-batches (`lax.scan` / `lax.map`), the log-prob head over time chunks and Gated DeltaNet
over chunks, so XLA's figure is a per-iteration figure. `jaxpr_flops` counts every `dot_general` and convolution
of the traced program (`2·M·N·K`), multiplied by the trip counts of the scans around it; the backward pass is in
the jaxpr already (the program calls `value_and_grad`), and so is any rematerialised forward.

Analytic model FLOPs (MaxText's MFU convention, its `calculate_tflops_training_per_device`): per token, a forward
costs `2·N_active + 2·L_attn·H·D_head·T` and a training step `6·N_active + 6·L_attn·H·D_head·T`, where `N_active`
counts the parameters a token's matmuls touch (MoE experts scaled by top-k / num_experts, no embedding lookup) and
the second term is causal softmax attention (`Q·Kᵀ` and `P·V` over the T·(T+1)/2 ≈ T²/2 query-key pairs a causal
mask leaves, what a causal kernel such as splash computes) in the `L_attn` full-attention layers. PaLM's appendix B
(Chowdhery et al. 2022) counts full attention, twice that term (`full_attention_flops`): this project used it until
2026-12-06, and report rows record which count they hold (`MODEL_FLOPS_CONVENTION`).

HBM: `memory_analysis()` of a compiled program, or — when XLA refuses to compile because the program does not fit
— the buffer assignment XLA dumps before it gives up (`xla_dump_to`): the same argument / output / temporary split,
and the largest buffers with the jax operation that made each.
"""
from __future__ import annotations

import dataclasses
import glob
import math
import os
import re
from typing import Any, Sequence

import flax.linen as nn
import jax
from jax.extend import core as jax_core
import numpy as np

from sao.models.config import ModelConfig


# --------------------------------------------------------------------------------------------- FLOPs of a program
def jaxpr_flops(jaxpr: Any, platform: str | None = None) -> float:
  """Matmul FLOPs of a (closed) jaxpr, loops multiplied out.

  Counted: `dot_general` and convolutions (`2·M·N·K`); `ragged_dot_general` (a grouped matmul: each row meets one
  group's matrix, so `2·M·K·N`, not `G` times that); a Pallas kernel (`pallas_call`, e.g. megablox's `gmm`) by
  the `cost_estimate` it declares — its body is one grid step and its grid may be data-dependent — or, without
  one, its body times a static grid. A `shard_map` body (local shapes) counts once per device of its manual axes, so
  the total stays the whole program's over all chips. A `cond` counts its most expensive branch, except the branches of
  `lax.platform_dependent` when `platform` ("tpu", "cpu", …) is given: then the branch that platform runs. A
  `while` of unknown trip count counts its body once."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  platform_index = {}  # outvar of a `platform_index` eqn -> its `platforms` (one tuple of names per branch)
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      (contract, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contract)
    elif name == "ragged_dot_general":
      total += _ragged_dot_flops(eqn)
    elif name == "conv_general_dilated":
      rhs = eqn.invars[1].aval.shape  # [out_features, in_features / groups, *window] in the default layout
      spec = eqn.params["dimension_numbers"]
      window = math.prod(rhs[d] for d in spec.rhs_spec[2:])
      total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * window * rhs[spec.rhs_spec[1]]
    elif name == "pallas_call":
      total += _pallas_flops(eqn, platform)
    elif name == "platform_index":
      platform_index[eqn.outvars[0]] = eqn.params["platforms"]
    elif name == "scan":
      total += eqn.params["length"] * jaxpr_flops(eqn.params["jaxpr"], platform)
    elif name == "shard_map":  # its body's shapes are one shard's: every device of the manual axes runs it
      total += _manual_devices(eqn.params) * jaxpr_flops(eqn.params["jaxpr"], platform)
    elif name == "cond":
      branches = eqn.params["branches"]
      index = eqn.invars[0]
      chosen = _platform_branch(platform_index[index], platform) if platform and index in platform_index else None
      total += (jaxpr_flops(branches[chosen], platform) if chosen is not None
                else max(jaxpr_flops(b, platform) for b in branches))
    else:  # jit, checkpoint (remat), custom_jvp/vjp calls, while: recurse into every sub-jaxpr once
      for value in eqn.params.values():
        for sub in value if isinstance(value, (tuple, list)) else (value,):
          if isinstance(sub, (jax_core.Jaxpr, jax_core.ClosedJaxpr)):
            total += jaxpr_flops(sub, platform)
  return total


def _manual_devices(params: dict[str, Any]) -> int:
  """How many devices run a `shard_map` body: the product of the mesh axes it makes manual (`newly_manual_axes` in
  jax 0.10; `manual_axes`, or the mesh less `auto`, elsewhere), over which the body sees local shapes."""
  mesh = params["mesh"]
  sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
  if "newly_manual_axes" in params:
    axes = params["newly_manual_axes"]
  elif "manual_axes" in params:
    axes = params["manual_axes"]
  else:
    axes = set(sizes) - set(params.get("auto", ()))
  return math.prod(sizes[a] for a in axes)


def _ragged_dot_flops(eqn: Any) -> float:
  """`2·Σ_rows K·N` of a `ragged_dot_general`: with the ragged dimension among the lhs's contracting dims (the
  weight gradient, output `[G, K, N]`) each contracted row belongs to one group, so the output's `G` copies share one
  contraction; otherwise it is a dot_general's count."""
  numbers = eqn.params["ragged_dot_dimension_numbers"]
  (contract, _), _ = numbers.dot_dimension_numbers
  lhs = eqn.invars[0].aval.shape
  flops = 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contract)
  if any(d in contract for d in numbers.lhs_ragged_dimensions):
    flops /= eqn.invars[2].aval.shape[0]  # the group count G (group_sizes is [G])
  return flops


def _pallas_flops(eqn: Any, platform: str | None) -> float:
  estimate = eqn.params.get("cost_estimate")
  if estimate is not None and estimate.flops is not None:
    return float(estimate.flops)
  grid = eqn.params["grid_mapping"].grid
  if not all(isinstance(n, int) for n in grid):
    raise ValueError(f"pallas_call without a cost_estimate and with a dynamic grid {grid}: its FLOPs are unknown "
                     "(give the kernel a pl.CostEstimate)")
  return math.prod(grid) * jaxpr_flops(eqn.params["jaxpr"], platform)


def _platform_branch(platforms: Sequence[Sequence[str] | None], platform: str) -> int | None:
  """The `cond` branch `lax.platform_dependent` runs on `platform` (`None` in `platforms` marks the default)."""
  for i, names in enumerate(platforms):
    if names is not None and platform in names:
      return i
  return next((i for i, names in enumerate(platforms) if names is None), None)


def program_flops(fn: Any, *args: Any) -> float:
  """`jaxpr_flops` of `fn` traced on abstract `args` (global shapes: the whole program over all chips)."""
  return jaxpr_flops(jax.make_jaxpr(fn)(*args))


# --------------------------------------------------------------------------------------------- analytic FLOPs
def active_params(model_config: ModelConfig, abstract_params: Any) -> float:
  """Parameters a token's matmuls touch: all but the embedding table, routed experts scaled by k / X."""
  total = 0.0
  scale = (model_config.num_experts_per_tok / model_config.num_experts) if model_config.num_experts else 1.0
  for path, leaf in jax.tree_util.tree_flatten_with_path(nn.meta.unbox(abstract_params))[0]:
    keys = [str(getattr(k, "key", k)) for k in path]
    if "embed_tokens" in keys:
      continue
    total += float(np.prod(leaf.shape)) * (scale if "experts" in keys else 1.0)
  return total


# The count `analytic_flops` gives; report rows record it (rows without the field hold PaLM's "full_attention").
MODEL_FLOPS_CONVENTION = "causal_attention"


def analytic_flops(model_config: ModelConfig, n_active: float, batch: int, length: int, train: bool) -> float:
  """Model FLOPs of one pass over `[batch, length]` tokens, attention counted causal (the module docstring):
  `(3 if train else 1) · (2·N_active·B·T + full_attention_flops / 2)`."""
  dense = (3.0 if train else 1.0) * 2.0 * n_active * batch * length
  return dense + full_attention_flops(model_config, batch, length, train) / 2


def full_attention_flops(model_config: ModelConfig, batch: int, length: int, train: bool) -> float:
  """Full (non-causal) softmax attention's `Q·Kᵀ` and `P·V` in every full-attention layer,
  `(3 if train else 1) · 4·L_attn·H·D_head·T²·B`: PaLM's attention term; `analytic_flops` counts half of it (MaxText's
  `causal_attention_flops = noncausal_attention_flops / 2`), so PaLM's count of a pass is
  `analytic_flops + full_attention_flops / 2`."""
  attn_layers = sum(kind == "full_attention" for kind in model_config.layer_types)
  return (3.0 if train else 1.0) * 4.0 * attn_layers * model_config.num_heads * model_config.head_dim * \
      float(length) ** 2 * batch


# --------------------------------------------------------------------------------------------- HBM from XLA dumps
@dataclasses.dataclass
class Buffer:
  size: int
  kind: str  # argument | output | temporary
  instruction: str  # the HLO value's defining instruction
  shape: str
  op_name: str = ""  # the jax operation behind it (HLO metadata), when XLA kept one


@dataclasses.dataclass
class BufferReport:
  argument_bytes: int
  output_bytes: int  # outputs not aliased to a (donated) argument
  temp_bytes: int
  largest: list[Buffer]


_ALLOCATION = re.compile(r"^allocation (\d+): size (\d+)(.*):$")
_VALUE = re.compile(r"^ value: <\d+ (\S+) @[^>]*> \(size=(\d+),offset=\d+\): (\S+)")
_OP_NAME = re.compile(r"^\s*(?:ROOT )?%?(\S+) = .*?metadata=\{op_name=\"([^\"]*)\"")


def _module_file(dump_dir: str, suffix: str) -> str | None:
  # The compiled program is the module with the highest number whose file has this suffix.
  files = sorted(glob.glob(os.path.join(dump_dir, f"module_*{suffix}")))
  return files[-1] if files else None


def buffer_report(dump_dir: str, top: int = 3) -> BufferReport | None:
  """The HBM (memory space 0) buffer assignment XLA dumped into `dump_dir`; None when there is none."""
  path = _module_file(dump_dir, ".after_optimizations-buffer-assignment.txt")
  if path is None:
    return None
  sizes = {"argument": 0, "output": 0, "temporary": 0}
  buffers: list[Buffer] = []
  kind = None
  with open(path) as f:
    for line in f:
      match = _ALLOCATION.match(line.rstrip("\n"))
      if match:
        attrs = match.group(3)
        if "thread-local" in attrs or re.search(r"\bcolor [1-9]", attrs):
          kind = None  # scalars in registers, or on-chip memories other than HBM
          continue
        is_param = "parameter" in attrs
        is_output = "output shape" in attrs or "maybe-live-out" in attrs
        kind = "argument" if is_param else "output" if is_output else "temporary"
        sizes[kind] += int(match.group(2))
        continue
      if line.startswith("BufferAssignment") or line.startswith("Used values"):
        kind = None
      value = _VALUE.match(line) if kind else None
      if value:
        # `fusion.12{1}`: element 1 of a multi-output instruction's tuple; the instruction is `fusion.12`.
        buffers.append(Buffer(int(value.group(2)), kind, value.group(1).split("{")[0], value.group(3).split("{")[0]))
  candidates = sorted(buffers, key=lambda b: -b.size)[:8 * top]
  names = {b.instruction for b in candidates}
  hlo = _module_file(dump_dir, ".after_optimizations.txt")
  if hlo and names:
    op_names = {}
    with open(hlo) as f:
      for line in f:
        match = _OP_NAME.match(line)
        if match and match.group(1) in names:
          op_names.setdefault(match.group(1), match.group(2))
    for b in candidates:
      b.op_name = op_names.get(b.instruction, "")
  largest: list[Buffer] = []  # one per (jax operation, shape): XLA's rematerialised copies of a buffer count once
  for b in candidates:
    if len(largest) < top and not any((o.op_name, o.shape) == (b.op_name, b.shape) for o in largest):
      largest.append(b)
  return BufferReport(sizes["argument"], sizes["output"], sizes["temporary"], largest)


_REQUIRED = re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT]?)\).*available HBM \(([\d.]+)([KMGT]?)\)")


def oom_required_bytes(message: str) -> tuple[int, int] | None:
  """(required, available) bytes from XLA's "Ran out of memory on HBM" message, or None."""
  match = _REQUIRED.search(message)
  if not match:
    return None
  unit = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
  return (int(float(match.group(1)) * unit[match.group(2)]), int(float(match.group(3)) * unit[match.group(4)]))


def compile_with_report(lowered: Any, top: int = 3,
                        prefix: str = "sao_compile_") -> tuple[Any | None, str, BufferReport | None]:
  """Compiles `lowered` with XLA's dumps in a temporary directory. Returns (the compiled program, or None when XLA
  refused it for memory; XLA's RESOURCE_EXHAUSTED line or ""; the buffer report of the dump, None if there is
  none). Any other compile error propagates."""
  import tempfile  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory(prefix=prefix) as dump_dir:
    error, compiled = "", None
    try:
      compiled = lowered.compile(compiler_options={"xla_dump_to": dump_dir})
    except jax.errors.JaxRuntimeError as e:
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      error = str(e).splitlines()[0]
    return compiled, error, buffer_report(dump_dir, top)
