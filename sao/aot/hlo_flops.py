"""Matmul FLOPs of the instructions of an optimized HLO module (`sao.aot.hlo_text`), as `sao.aot.hlo_cost`
prices them; pure arithmetic on shapes, no jax.

- dot: `2 · prod(result dims) · prod(lhs contracting dims)`.
- convolution: `2 · prod(result batch & feature dims) · (input features per group) · (window taps that land on real
  input, summed over output positions)`. XLA on TPU writes batched matmuls as convolutions whose batch dims are
  spatial dims with a window as large as the input over a dilated input: almost every tap hits a hole, so counting
  the window's size would overcount by the batch size.
- Pallas kernels (`tpu_custom_call`), from their operand shapes: megablox `gmm` (`[m, k] @ [G, k, n] → [m, n]`, or
  `[G, n, k]` with `transpose_rhs`) and `tgmm` (`[k, m] · [m, n] → [G, k, n]`), `2·m·k·n` each (every row of the
  ragged dimension belongs to one group: the kernels' own static estimate; `grouped_rows` gives m and G so that
  `sao.aot.hlo_cost` can price only the rows in the local groups under expert parallelism); splash attention (`splash_{mqa,mha}_{fwd,dq,dkv}…`, `_splash_flops`):
  `c·n·S·D` times the fraction of [block_q, block_kv] tiles a causal mask leaves visible (the kernel skips the
  others; block sizes from the kernel's `xprof_metadata`, else one half), n the query rows (the query operand
  `[…, T, D]` but its last dim), S the key length, with c = 4 forward (Q·Kᵀ, P·V), 6 for the dq kernel (Q·Kᵀ again,
  dO·Vᵀ, dS·K) and 8 for the dkv kernel (Q·Kᵀ, dO·Vᵀ, Pᵀ·dO, dSᵀ·Q); None for any other kernel, which the caller
  lists by name.
- GPU library calls, from their backend config: cuBLAS / cuBLASLt gemms (`__cublas$gemm`, `__cublas$lt$matmul…`)
  `2 · prod(result dims) · prod(lhs contracting dims)` as a dot (the result is the tuple's first array, the second
  is cuBLAS's workspace); cuDNN's fused attention (`__cudnn$fmha…`), from the `[B, N, T, S]` score shape in its
  config and the head dim H of the query: forward `4·B·N·T·S·H` (Q·Kᵀ and P·V), backward `10·B·N·T·S·H` (the
  scores again, then dP, dV, dQ, dK), halved under a causal mask (the kernel skips the masked blocks). Triton gemm
  fusions are fusions with a `dot` inside: `matmul_flops` counts them.
- MXU passes (`mxu_passes`): the TPU's matrix unit multiplies bf16; an f32 dot or convolution at `operand_precision`
  `high` runs 3 bf16 passes and at `highest` 6 (`jax.lax.Precision`'s docstring; XLA's `ALG_DOT_BF16_BF16_F32_X3` /
  `_X6`), `default` one. `matmul_work` is the FLOPs times the passes: what the matrix unit executes, and what
  `sao.aot.hlo_cost` prices an instruction's compute time by (its FLOPs, for MFU, stay the model's).
"""
from __future__ import annotations

import functools
import math
import re

import numpy as np

from sao.aot.hlo_text import Computation, Instruction, Module

# bf16 passes of an f32 matmul on the TPU's matrix unit, by operand precision (`jax.lax.Precision`).
PRECISION_PASSES = {"default": 1, "high": 3, "highest": 6}


def mxu_passes(inst: Instruction, comp: Computation) -> int:
  """bf16 passes of one dot / convolution: an explicit `algorithm=dot_…_x<N>` gives N (`dot_f32_f32_f32`: 6);
  else the largest `PRECISION_PASSES` of `operand_precision` over the f32 operands (a bf16 operand is one pass at
  any precision); 1 without either attribute."""
  algorithm = inst.attr("algorithm")
  if algorithm:
    repeat = re.search(r"_x(\d+)$", algorithm)
    return int(repeat.group(1)) if repeat else 6 if "f32_f32_f32" in algorithm else 1
  precision = inst.attr("operand_precision")
  if not precision:
    return 1
  levels = precision.strip("{}").split(",")
  passes = 1
  for operand, level in zip(inst.operands, levels):
    source = comp.by_name.get(operand)
    if source is not None and source.shape and source.shape[0].dtype == "f32":
      passes = max(passes, PRECISION_PASSES.get(level.strip(), 1))
  return passes


def dot_flops(inst: Instruction, comp: Computation) -> float:
  lhs = comp.by_name[inst.operands[0]].shape[0].dims
  contracting = [int(d) for d in (inst.attr("lhs_contracting_dims") or "{}").strip("{}").split(",") if d]
  return 2.0 * math.prod(inst.shape[0].dims) * math.prod(lhs[d] for d in contracting)


@functools.lru_cache(maxsize=None)
def _valid_taps(in_size: int, out_size: int, size: int, stride: int, pad_low: int, lhs_dilate: int,
                rhs_dilate: int) -> int:
  """Σ over output positions of the window taps that land on an input element (not padding, not a dilation hole)."""
  o = np.arange(out_size, dtype=np.int64)[:, None]
  k = np.arange(size, dtype=np.int64)[None, :]
  total, chunk = 0, max(1, (1 << 22) // max(size, 1))  # rows per chunk: bounded memory for big windows
  for rows in range(0, out_size, chunk):
    pos = o[rows:rows + chunk] * stride + k * rhs_dilate - pad_low
    total += int(np.count_nonzero((pos >= 0) & (pos <= (in_size - 1) * lhs_dilate) & (pos % lhs_dilate == 0)))
  return total


def conv_flops(inst: Instruction, comp: Computation) -> float:
  labels = inst.attr("dim_labels")
  if not labels:
    raise ValueError(f"HLO: convolution {inst.name} without dim_labels")
  lhs_labels, rest = labels.split("_")
  rhs_labels, out_labels = rest.split("->")
  lhs = comp.by_name[inst.operands[0]].shape[0].dims
  rhs = comp.by_name[inst.operands[1]].shape[0].dims
  out = inst.shape[0].dims
  spatial = [c for c in out_labels if c.isdigit()]
  window = inst.attr("window") or "{}"
  fields = dict(re.findall(r"(\w+)=([\w_x\-]+)", window.strip("{}")))
  per_dim = lambda key, default: ([int(v) for v in fields[key].split("x")] if key in fields
                                  else [default] * len(spatial))
  sizes, strides = per_dim("size", 1), per_dim("stride", 1)
  lhs_dil, rhs_dil = per_dim("lhs_dilate", 1), per_dim("rhs_dilate", 1)
  pads = [int(p.split("_")[0]) for p in fields["pad"].split("x")] if "pad" in fields else [0] * len(spatial)
  taps = 1
  for i, d in enumerate(spatial):
    taps *= _valid_taps(lhs[lhs_labels.index(d)], out[out_labels.index(d)], sizes[i], strides[i], pads[i],
                        lhs_dil[i], rhs_dil[i])
  batch_feature = out[out_labels.index("b")] * out[out_labels.index("f")]
  return 2.0 * batch_feature * rhs[rhs_labels.index("i")] * taps


def kernel_name(inst: Instruction) -> str:
  """A Pallas kernel's name: `jit(<name>)/pallas_call` in the op_name, else the instruction's name."""
  match = re.search(r"jit\((\w+)\)/pallas_call", inst.op_name)
  return match.group(1) if match else inst.name.split(".")[0]


def custom_call_target(inst: Instruction) -> str:
  return (inst.attr("custom_call_target") or "").strip('"')


def _gpu_library_flops(inst: Instruction, comp: Computation, target: str) -> float | None:
  """FLOPs of a cuBLAS gemm or a cuDNN fused attention call (module docstring), None for another target."""
  config = inst.attr("backend_config") or ""
  if target.startswith("__cublas$"):
    match = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', config)
    if not match or not inst.shape:
      return None
    lhs = comp.by_name[inst.operands[0]].shape[0].dims
    contracting = [int(d.strip().strip('"')) for d in match.group(1).split(",") if d.strip()]
    return 2.0 * math.prod(inst.shape[0].dims) * math.prod(lhs[d] for d in contracting)
  if target.startswith("__cudnn$fmha"):
    scores = re.search(r'"intermediate_tensor_shape":\{.*?"dimensions":\[([^\]]*)\]', config)
    if not scores or not inst.operands:
      return None
    b, n, t, s = (int(d.strip().strip('"')) for d in scores.group(1).split(","))
    head_dim = comp.by_name[inst.operands[0]].shape[0].dims[-1]
    mask = re.search(r'"mask_type":"(\w+)"', config)
    causal = 0.5 if mask and "CAUSAL" in mask.group(1) else 1.0
    matmuls = 10.0 if "Backward" in target else 4.0
    return matmuls * b * n * t * s * head_dim * causal
  return None


def grouped_rows(inst: Instruction, comp: Computation) -> tuple[int, int, float] | None:
  """(m ragged rows, G groups, bytes of the arrays that do not scale with m: the stacked [G, …] weight or weight
  gradient) of a megablox `gmm` / `tgmm` call, None for any other instruction."""
  if custom_call_target(inst) != "tpu_custom_call" or kernel_name(inst) not in ("gmm", "tgmm"):
    return None
  shapes = [comp.by_name[o].shape[0] for o in inst.operands if comp.by_name[o].shape]
  out = inst.shape[0]
  stacked = out if len(out.dims) == 3 else next((a for a in shapes if len(a.dims) == 3), None)
  if stacked is None:
    return None
  rows = out.dims[0] if len(out.dims) == 2 else next((a.dims[0] for a in shapes if len(a.dims) == 2
                                                      and a.dims[1] == out.dims[2]), None)
  if rows is None:
    return None
  return rows, stacked.dims[0], stacked.bytes if stacked.memory_space == 0 else 0.0


# Megablox's row tile as `sao.models.grouped_matmul` calls it (MaxText's 512, or M rounded up to 128 when smaller).
MEGABLOX_ROW_TILE = 512


def active_grouped_rows(rows: int, groups: int, share: float) -> float:
  """Rows a megablox gmm / tgmm computes when `share` of its `rows` fall in its `groups` (expert parallelism over E
  shards with balanced routing: share = 1/E, the rest sorted after every local group, which its grid never visits):
  share·m plus one row tile per group (the partial tiles at the groups' edges), never more than m."""
  tile = min(MEGABLOX_ROW_TILE, -(-rows // 128) * 128)
  return float(rows) if share >= 1.0 else min(float(rows), share * rows + groups * tile)


def custom_call_flops(inst: Instruction, comp: Computation) -> float | None:
  """FLOPs of a known Pallas kernel or GPU library call from its shapes, None for one this does not know."""
  target = custom_call_target(inst)
  if target != "tpu_custom_call":
    return _gpu_library_flops(inst, comp, target)
  kernel = kernel_name(inst)
  arrays = [comp.by_name[o].shape[0].dims for o in inst.operands if comp.by_name[o].shape]
  out = inst.shape[0].dims
  if kernel == "gmm" and len(out) == 2:  # lhs [m, k], rhs [G, k, n] (or [G, n, k] with transpose_rhs)
    lhs = [a for a in arrays if len(a) == 2 and a[0] == out[0]]
    if lhs:
      return 2.0 * out[0] * lhs[0][1] * out[1]
  if kernel == "tgmm" and len(out) == 3:  # lhs [k, m], rhs [m, n] → [G, k, n]
    rhs = [a for a in arrays if len(a) == 2 and a[1] == out[2]]
    if rhs:
      return 2.0 * out[1] * out[2] * rhs[-1][0]
  if kernel.startswith("splash_"):
    return _splash_flops(inst, comp, kernel)
  return None


# Matmuls per (query row, key, head-dim element) of each splash kernel, and its block-size keys in `xprof_metadata`.
SPLASH_PHASES = {"fwd": (4.0, "block_q", "block_kv"), "dq": (6.0, "block_q_dq", "block_kv_dq"),
                 "dkv": (8.0, "block_q_dkv", "block_kv_dkv")}


def causal_tile_fraction(length: int, block_q: int, block_kv: int) -> float:
  """The share of the [block_q, block_kv] tiles of a causal [length, length] mask with a visible entry: tile (i, j)
  is visible when its first key j·block_kv is at most its last query (i + 1)·block_q − 1."""
  rows, cols = -(-length // block_q), -(-length // block_kv)
  visible = sum(min(cols, -(-min((i + 1) * block_q, length) // block_kv)) for i in range(rows))
  return visible / (rows * cols)


def _splash_flops(inst: Instruction, comp: Computation, kernel: str) -> float | None:
  """FLOPs of a splash-attention kernel (module docstring); the mask is taken to be causal (the only one sao
  builds, `sao.models.splash_attention`)."""
  phase = re.match(r"splash_m[qh]a_(fwd|dq|dkv)", kernel)
  floats = [comp.by_name[o].shape[0].dims for o in inst.operands
            if comp.by_name[o].shape and comp.by_name[o].shape[0].dtype in ("bf16", "f16", "f32")]
  if not phase or len(floats) < 2 or len(floats[0]) < 2 or len(floats[1]) < 2:
    return None
  factor, q_key, kv_key = SPLASH_PHASES[phase.group(1)]
  q, k = floats[0], floats[1]  # the query [..., T, D], then the keys [..., S, D]
  length, keys, head_dim = q[-2], k[-2], q[-1]
  sizes = {key: int(v) for key, v in re.findall(r'(block_\w+)\\?": (\d+)', inst.attrs)}
  if q_key in sizes and kv_key in sizes and length == keys:
    fraction = causal_tile_fraction(length, sizes[q_key], sizes[kv_key])
  else:
    fraction = 0.5
  return factor * math.prod(q[:-1]) * keys * head_dim * fraction


def matmul_flops(module: Module, comp: Computation, passes: bool = False) -> float:
  """Matmul FLOPs of one run of a (fused) computation, nested fusions included; with `passes`, each times its
  `mxu_passes` (`matmul_work`)."""
  total = 0.0
  for inst in comp.instructions:
    if inst.opcode in ("dot", "convolution"):
      flops = dot_flops(inst, comp) if inst.opcode == "dot" else conv_flops(inst, comp)
      total += flops * (mxu_passes(inst, comp) if passes else 1)
    elif inst.opcode == "fusion":
      total += matmul_flops(module, module.computations[inst.called["calls"][0]], passes)
  return total


def matmul_work(module: Module, comp: Computation) -> float:
  """What the matrix unit executes for one run of a (fused) computation: Σ FLOPs × `mxu_passes`."""
  return matmul_flops(module, comp, passes=True)


