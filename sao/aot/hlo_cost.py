"""Where the time of a compiled program goes, by XLA's kind of cost model: every executed instruction of an
optimized HLO module priced by the roofline of one chip, loops multiplied out, and attributed to a kind of work, a
part of the model and forward / backward / remat recompute.

Pure parsing and arithmetic (`sao.aot.hlo_text`; no jax). The HLO is the per-device SPMD program, so every figure
here is per chip. For each top-level instruction (those the entry computation runs, through `while` bodies,
`conditional` branches, `call`s and async calls, each multiplied by the trip counts around it):

- FLOPs: the matmuls' (dots and convolutions, inside fusions too, and the Pallas kernels it knows:
  `sao.aot.hlo_flops`); any other custom call is listed by name (`unknown_custom_calls`), with no FLOPs.
- Bytes: HBM bytes read and written as XLA's cost analysis counts a fusion at the top level: its operands and its
  result, except that an operand the fusion only slices (slice, dynamic-slice, gather) counts the slices, and a
  result written by an in-place dynamic-update-slice counts the update (and its buffer operand nothing). Arrays
  in the core's on-chip memory (`S(1)`) cost no HBM bytes.
- Seconds: compute work `max(mxu flops / peak bf16 FLOP/s, bytes / HBM bandwidth)` (`compute` or `memory` bound by
  the larger), where the MXU FLOPs are the FLOPs times the bf16 passes of an f32 matmul at `high` (3) or `highest`
  (6) operand precision (`hlo_flops.mxu_passes`); a collective `ring factor · bytes / ICI ring bandwidth` (`ici` bound), the ring factor `(n−1)/n` for an
  all-gather (of its result), reduce-scatter and all-to-all (of the operand), `2(n−1)/n` for an all-reduce, 1 for a
  collective-permute, over a group of n chips (`replica_groups`; the TPU's async collective fusion is priced at its
  start as the collective it holds, its done is free); the ICI ring bandwidth is
  `tpu_topology.Chip.ici_ring_bytes_per_second` (a bidirectional ring over one torus axis: two links per chip).
  Nothing overlaps: the program's time is the sum, an upper bound of a schedule that hides collectives and copies
  behind compute (`sao.aot.hlo_overlap` takes off what the schedule's async collectives hide).
  `max(Σ flops / peak, Σ bytes / bandwidth)` (XLA's whole-program roofline, what `compile_tpu.py` reports when XLA's
  own time is negative) is the lower bound beside it.

Attribution: `kind` (matmul, elementwise, copy/transpose — data movement: copies, transposes, slices, pads,
concatenations, in-place updates —, collective, custom-call, other — gather, scatter, sort, reduce-window …),
`part` (the jax name scope of the op in `op_name`, then the file of the innermost Python frame: `MODEL_PARTS`)
and `phase` (forward, backward: `transpose(` in the name, recompute: `rematted_computation`, update: optimizer).
"""
from __future__ import annotations

import collections
import dataclasses
import math
import re
from typing import TYPE_CHECKING

from sao.aot.hlo_async import COLLECTIVES, async_collective_fusion, carried_state
from sao.aot.hlo_flops import (active_grouped_rows, conv_flops, custom_call_flops, custom_call_target, dot_flops,
                               grouped_rows, kernel_name, matmul_flops, matmul_work, mxu_passes)
from sao.aot.hlo_text import Computation, Instruction, Module, read_module, trip_count

if TYPE_CHECKING:  # the chip facts; imported for the type only, so that this module runs without jax
  from sao.aot.tpu_topology import Chip

FREE = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "after-all", "partition-id", "replica-id",
        "opt-barrier", "add-dependency", "copy-done", "slice-done", "all-gather-done", "all-reduce-done",
        "collective-permute-done", "async-done", "call-done", "send-done", "recv-done", "domain", "iota"}
# `slice-start` / `slice-done`: XLA:TPU's sliced prefetch, a window of an HBM buffer copied asynchronously (often into
# the core's memory, `S(1)`): priced at its start by the window's bytes (`op_bytes`), its done free.
MOVES = {"copy", "copy-start", "slice-start", "transpose", "slice", "dynamic-slice", "dynamic-update-slice",
         "concatenate", "pad", "reshape", "broadcast", "reverse"}
OTHER = {"gather", "scatter", "sort", "reduce-window", "select-and-scatter", "rng", "rng-bit-generator", "fft",
         "cholesky", "triangular-solve", "top-k"}
# Custom calls that move no data and compute nothing (buffer bookkeeping, hints, async plumbing).
FREE_CUSTOM_CALLS = {"AllocateBuffer", "AssumeGatherIndicesInBound", "PrepareAsyncCallStart", "PrepareAsyncCallDone",
                     "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "GatherScatterIndicesBitpacked"}
# (part, pattern on op_name) — first match wins; then the innermost frame's file (FILE_PARTS); else "other".
MODEL_PARTS = (
    ("shared expert", r"/mlp/shared_expert"),
    ("MoE experts", r"/mlp/(.*/)?(shard_map|experts|ragged_dot|gmm)"),
    ("MLP", r"/mlp/(gate_proj|up_proj|down_proj)/"),
    ("router", r"/mlp/"),
    ("attention", r"/self_attn/"),
    ("gated deltanet", r"/linear_attn/"),
    ("norms", r"layernorm|/norm/"),
    ("embedding", r"embed_tokens"),
    ("value head", r"value_head"),
    ("lm head / log-probs", r"lm_head|logprob"),
)
FILE_PARTS = (("optimizer", r"optax/|sao/train/optim\.py"), ("lm head / log-probs", r"sao/models/logprobs\.py"),
              ("loss", r"sao/train/actor_losses\.py|sao/core/"), ("layer scan", r"sao/models/scan\.py"))
LAYER_PARTS = (("layer scan", r"/stack\b|dynamic_index_in_dim"), ("residual", r"DecoderLayer/"))


@dataclasses.dataclass
class OpCost:
  """One executed instruction: its cost per execution, and how often one run of the program executes it."""
  name: str
  opcode: str
  kind: str
  part: str
  phase: str
  op_name: str
  count: float  # executions per program run (the trip counts of the loops around it, multiplied)
  flops: float  # matmul FLOPs per execution
  bytes: float  # HBM bytes (or, for a collective, bytes on the wire before the ring factor) per execution
  seconds: float  # per execution
  bound: str  # compute | memory | ici
  group_size: int = 0  # chips in a collective's group
  detail: str = ""  # the collective, or the custom call's kernel
  shape: str = ""  # the result, e.g. bf16[1048576,32]
  mxu_flops: float = 0.0  # per execution, what the matrix unit runs: FLOPs × bf16 passes (`hlo_flops.mxu_passes`)

  @property
  def total_seconds(self) -> float:
    return self.count * self.seconds


@dataclasses.dataclass
class Breakdown:
  ops: list[OpCost]
  unknown_custom_calls: dict[str, int]  # kernel / target → executions
  unknown_trip_counts: list[str]  # loops whose trip count could not be found (counted once)
  flops_once: float  # Σ matmul FLOPs with every loop body counted once (XLA's cost analysis counts loops so)
  # Seconds inside `conditional`s, where the most expensive branch is counted (an upper bound: e.g. blockwise causal
  # attention skips the blocks above the diagonal at run time, about half of them).
  conditional_seconds: float = 0.0
  # What taking every conditional's cheapest branch instead would save (the lower bound beside it: e.g. the MoE's
  # capacity path, `sao.models.moe._bounded_experts`, whose every-row branch runs only when a shard overflows).
  conditional_savings: float = 0.0

  def total(self) -> float:
    """Seconds of one run of the program: Σ count · seconds."""
    return sum(o.total_seconds for o in self.ops)

  def share(self, key: str) -> dict[str, float]:
    """Seconds per value of `key` (kind, part, phase, bound), largest first."""
    out = collections.Counter()
    for o in self.ops:
      out[getattr(o, key)] += o.total_seconds
    return dict(out.most_common())


# --------------------------------------------------------------------------------------------- bytes
def _hbm(leaves) -> float:
  return sum(leaf.bytes for leaf in leaves if leaf.memory_space == 0)


def _through_bitcasts(comp: Computation, name: str) -> list[Instruction]:
  """The users of `name`, looking through bitcasts."""
  users = []
  for user in comp.users.get(name, []):
    users += _through_bitcasts(comp, user.name) if user.opcode == "bitcast" else [user]
  return users


def _source(comp: Computation, name: str) -> Instruction:
  inst = comp.by_name[name]
  while inst.opcode == "bitcast":
    inst = comp.by_name[inst.operands[0]]
  return inst


def fusion_bytes(module: Module, inst: Instruction, comp: Computation, fused: Computation) -> float:
  """HBM bytes of a fusion as its caller sees them (see the module docstring)."""
  in_place = set()  # fused parameters a root dynamic-update-slice writes into
  written = 0.0
  roots = [_source(fused, n) for n in fused.root.operands] if fused.root.opcode == "tuple" else \
      [_source(fused, fused.root.name)]
  carried_params, carried_results = carried_state(fused)  # an async collective's state: priced on ICI at its start
  for i, (root, leaf) in enumerate(zip(roots, inst.shape)):
    if i in carried_results:
      continue
    if root.opcode == "dynamic-update-slice" and _source(fused, root.operands[0]).opcode == "parameter":
      in_place.add(_source(fused, root.operands[0]).name)
      written += _hbm(fused.by_name[root.operands[1]].shape) if leaf.memory_space == 0 else 0.0
    else:
      written += _hbm([leaf])
  read = 0.0
  for i, operand in enumerate(inst.operands):
    param = fused.parameter(i)
    if param.name in in_place or param.name in carried_params:
      continue
    whole = _hbm(comp.by_name[operand].shape)
    sliced = _sliced_bytes(module, fused, param.name) if whole else None
    read += whole if sliced is None else min(whole, sliced)
  return read + written


def _sliced_bytes(module: Module, fused: Computation, name: str) -> float | None:
  """Bytes of `name` (a value in a fused computation) that its users read when every one of them only slices it —
  directly, or inside a nested fusion —, None when some user reads it whole."""
  users = _through_bitcasts(fused, name)
  if not users:
    return None
  total = 0.0
  for user in users:
    if user.opcode in ("slice", "dynamic-slice", "gather") and _source(fused, user.operands[0]).name == name:
      total += sum(leaf.bytes for leaf in user.shape)
    elif user.opcode == "fusion":
      nested = module.computations[user.called["calls"][0]]
      for i, operand in enumerate(user.operands):
        if _source(fused, operand).name == name:
          inner = _sliced_bytes(module, nested, nested.parameter(i).name)
          if inner is None:
            return None
          total += inner
    else:
      return None
  return total


def op_bytes(inst: Instruction, comp: Computation) -> float:
  """HBM bytes of an unfused instruction: operands and result, a slice or in-place update counting its part."""
  if inst.opcode in ("dynamic-slice", "slice"):
    return 2 * _hbm(inst.shape)
  if inst.opcode == "dynamic-update-slice":
    return 2 * _hbm(comp.by_name[inst.operands[1]].shape)
  if inst.opcode == "copy-start":  # (source, destination, context): one read and one write
    return _hbm(inst.shape[:2])
  if inst.opcode == "slice-start":  # ((source), window, context): the window read, written where it lands
    return inst.shape[1].bytes + _hbm(inst.shape[1:2])
  return sum(_hbm(comp.by_name[o].shape) for o in inst.operands) + _hbm(inst.shape)


# --------------------------------------------------------------------------------------------- collectives
def group_size(inst: Instruction) -> int:
  """Chips in each of a collective's groups, from `replica_groups` in any of XLA's three spellings:
  `{{0,1},{2,3}}`, iota `[groups,size]<=[…]`, or mesh `mesh['axis_0'=8,'axis_1'=16] {'axis_1'}`."""
  text = inst.attrs
  mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]", text)
  if mesh:  # the axes follow, after an optional `, device_ids=([8,16]T(1,0))`
    sizes = {k: int(v) for k, v in re.findall(r"'([^']+)'=(\d+)", mesh.group(1))}
    # Each axis is `'name'` or a sub-axis `'name':(pre)size` (`size` chips of the axis, strided by `pre`).
    axes = re.match(r"(?:,\s*device_ids=\(\[[\d,]*\](?:T\([\d,]*\))?\))?\s*\{((?:\s*'[^']+'(?::\(\d+\)\d+)?\s*,?)+)\}",
                    text[mesh.end():])
    if axes:
      return math.prod(int(sub) if sub else sizes[name]
                       for name, sub in re.findall(r"'([^']+)'(?::\(\d+\)(\d+))?", axes.group(1)))
  iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", text)
  if iota:
    return int(iota.group(2))
  listed = re.search(r"replica_groups=\{\{([^}]*)\}", text)
  if listed:
    return len([x for x in listed.group(1).split(",") if x.strip()])
  if inst.opcode.startswith("collective-permute"):
    return 2
  raise ValueError(f"HLO: cannot read the replica groups of {inst.name}: {text[:300]!r}")


def collective_cost(inst: Instruction, comp: Computation, chip: Chip) -> tuple[float, float, int, str]:
  """(bytes, seconds, group size, collective) of one collective under the ring model of the module docstring."""
  kind = COLLECTIVES[inst.opcode]
  n = group_size(inst)
  operand_bytes = sum(comp.by_name[o].bytes for o in inst.operands)
  if kind == "all-gather":
    data = max(leaf.bytes for leaf in inst.shape) if inst.opcode.endswith("-start") else inst.bytes
    factor = (n - 1) / n
  elif kind == "all-reduce":
    data, factor = operand_bytes, 2 * (n - 1) / n
  elif kind == "collective-permute":
    data, factor = operand_bytes, 1.0
  else:  # reduce-scatter, all-to-all
    data, factor = operand_bytes, (n - 1) / n
  return data, factor * data / chip.ici_ring_bytes_per_second, n, kind


# --------------------------------------------------------------------------------------------- attribution
def fusion_kind(module: Module, fused: Computation) -> str:
  opcodes = set()
  stack = [fused]
  while stack:
    comp = stack.pop()
    for inst in comp.instructions:
      opcodes.add(inst.opcode)
      if inst.opcode == "fusion":
        stack.append(module.computations[inst.called["calls"][0]])
  if opcodes & {"dot", "convolution"}:
    return "matmul"
  if opcodes & OTHER:
    return "other"
  if opcodes - FREE - MOVES - {"fusion"}:
    return "elementwise"
  return "copy/transpose"


def model_part(module: Module, inst: Instruction) -> str:
  for part, pattern in MODEL_PARTS:
    if re.search(pattern, inst.op_name):
      return part
  stack = module.stack(inst.stack_frame)
  innermost = stack[0][0] if stack else ""
  for part, pattern in FILE_PARTS:
    if re.search(pattern, innermost):
      return part
  for part, pattern in LAYER_PARTS:
    if re.search(pattern, inst.op_name):
      return part
  return "other"


def phase_of(inst: Instruction, part: str) -> str:
  if part == "optimizer":
    return "update"
  if "rematted_computation" in inst.op_name:
    return "recompute"
  return "backward" if "transpose(" in inst.op_name else "forward"


# --------------------------------------------------------------------------------------------- the walk
def is_free(inst: Instruction) -> bool:
  """True for an instruction that costs nothing of itself (bookkeeping, the done half of an async pair)."""
  return inst.opcode in FREE or (inst.opcode == "custom-call" and
                                 (inst.attr("custom_call_target") or "").strip('"') in FREE_CUSTOM_CALLS)


def price(module: Module, comp: Computation, inst: Instruction, chip: Chip, count: float,
          unknown: collections.Counter, grouped_row_share: float = 1.0) -> OpCost:
  """One priced instruction (not a control-flow one: `_walk` descends into those). `grouped_row_share`: the
  expected share of a megablox gmm / tgmm's rows in its local groups (`breakdown`)."""
  flops, group, detail = 0.0, 0, ""
  work = None  # MXU FLOPs where they differ from the FLOPs (f32 matmuls at high / highest precision)
  async_pair = async_collective_fusion(module, inst)
  if inst.opcode in COLLECTIVES or (async_pair and async_pair[0] == "start"):
    # An async collective fusion's start is priced as the collective it holds (its done: free, `_walk`).
    collective, where = (inst, comp) if inst.opcode in COLLECTIVES else (
        async_pair[1], module.computations[inst.called["calls"][0]])
    data, seconds, group, detail = collective_cost(collective, where, chip)
    part = model_part(module, inst)
    return OpCost(inst.name, inst.opcode, "collective", part, phase_of(inst, part), inst.op_name, count, 0.0, data,
                  seconds, "ici", group, detail)
  if inst.opcode == "fusion":
    fused = module.computations[inst.called["calls"][0]]
    flops, data, kind = matmul_flops(module, fused), fusion_bytes(module, inst, comp, fused), fusion_kind(module, fused)
    work = matmul_work(module, fused) if flops else 0.0
  elif inst.opcode in ("dot", "convolution"):
    flops = dot_flops(inst, comp) if inst.opcode == "dot" else conv_flops(inst, comp)
    data, kind, work = op_bytes(inst, comp), "matmul", flops * mxu_passes(inst, comp)
  elif inst.opcode == "custom-call":
    target = custom_call_target(inst)
    detail = kernel_name(inst) if target == "tpu_custom_call" else target
    known = custom_call_flops(inst, comp)
    if known is None:
      unknown[detail] += count
    flops, data, kind = known or 0.0, op_bytes(inst, comp), "custom-call"
    ragged = grouped_rows(inst, comp) if grouped_row_share < 1.0 else None
    if ragged:  # only the local groups' row tiles run: FLOPs and the row-indexed arrays' bytes scale with them
      rows, groups, stacked_bytes = ragged
      active = active_grouped_rows(rows, groups, grouped_row_share) / rows
      flops, data = flops * active, stacked_bytes + active * (data - stacked_bytes)
  else:
    data = op_bytes(inst, comp)
    kind = "copy/transpose" if inst.opcode in MOVES else "other" if inst.opcode in OTHER else "elementwise"
  work = flops if work is None else work
  compute, memory = work / chip.peak_bf16_flops, data / chip.hbm_bytes_per_second
  part = model_part(module, inst)
  return OpCost(inst.name, inst.opcode, kind, part, phase_of(inst, part), inst.op_name, count, flops, data,
                max(compute, memory), "compute" if compute >= memory else "memory", group, detail, mxu_flops=work)


def _walk(module: Module, comp: Computation, chip: Chip, count: float, out: Breakdown,
          unknown: collections.Counter, share: float) -> None:
  for inst in comp.instructions:
    op = inst.opcode
    if op == "while":
      trips, how = trip_count(module, comp, inst)
      if trips is None:
        out.unknown_trip_counts.append(f"{inst.name} ({how}; counted once) {inst.op_name}")
        trips = 1
      _walk(module, module.computations[inst.called["body"][0]], chip, count * trips, out, unknown, share)
      _walk(module, module.computations[inst.called["condition"][0]], chip, count * (trips + 1), out, unknown,
            share)
    elif op == "conditional":  # the most expensive branch (which one runs is data)
      names = inst.called.get("branch_computations") or (inst.called.get("true_computation", []) +
                                                         inst.called.get("false_computation", []))
      branches = []
      for name in names:
        branch = Breakdown([], {}, [], 0.0)
        _walk(module, module.computations[name], chip, count, branch, unknown, share)
        branches.append(branch)
      if branches:
        chosen = max(branches, key=lambda b: b.total())
        out.ops += chosen.ops
        out.unknown_trip_counts += chosen.unknown_trip_counts
        out.conditional_seconds += chosen.total()  # nested conditionals are inside it already
        out.conditional_savings += chosen.total() - min(b.total() - b.conditional_savings for b in branches)
    elif op in ("call", "async-start", "call-start"):
      for key in ("calls", "to_apply"):
        for name in inst.called.get(key, []):
          _walk(module, module.computations[name], chip, count, out, unknown, share)
    elif is_free(inst) or (async_collective_fusion(module, inst) or ("",))[0] == "done":
      continue
    else:
      cost = price(module, comp, inst, chip, count, unknown, share)
      cost.shape = ", ".join(f"{leaf.dtype}[{','.join(map(str, leaf.dims))}]" for leaf in inst.shape[:2])
      out.ops.append(cost)


def _flops_once(module: Module, comp: Computation, seen: set[str]) -> float:
  """Matmul FLOPs with every loop body and branch counted once."""
  total = 0.0
  for inst in comp.instructions:
    if inst.opcode in ("dot", "convolution"):
      total += dot_flops(inst, comp) if inst.opcode == "dot" else conv_flops(inst, comp)
    elif inst.opcode == "fusion":
      total += matmul_flops(module, module.computations[inst.called["calls"][0]])
    elif inst.opcode == "custom-call":
      total += custom_call_flops(inst, comp) or 0.0
    else:
      for key in ("body", "condition", "branch_computations", "true_computation", "false_computation", "calls",
                  "to_apply"):
        for name in inst.called.get(key, []):
          if name not in seen:
            seen.add(name)
            total += _flops_once(module, module.computations[name], seen)
  return total


def breakdown(module: Module, chip: Chip, grouped_row_share: float = 1.0) -> Breakdown:
  """Every executed instruction of `module` priced on `chip` (see the module docstring). `grouped_row_share` < 1
  prices a megablox gmm / tgmm by the rows of its local groups (`active_grouped_rows`) instead of the kernel's
  static estimate over all its rows (1.0, the upper bound: every token routed to this shard's experts)."""
  if not 0.0 < grouped_row_share <= 1.0:
    raise ValueError(f"grouped_row_share: {grouped_row_share} is not in (0, 1]")
  out, unknown = Breakdown([], {}, [], 0.0), collections.Counter()
  entry = module.computations[module.entry]
  _walk(module, entry, chip, 1.0, out, unknown, grouped_row_share)
  out.unknown_custom_calls = dict(unknown)
  out.flops_once = _flops_once(module, entry, set())
  return out


def breakdown_of_file(path: str, chip: Chip, grouped_row_share: float = 1.0) -> Breakdown:
  return breakdown(read_module(path), chip, grouped_row_share)
