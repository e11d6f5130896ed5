"""`sao.aot.hlo_cost` / `hlo_flops` / `hlo_text`: a hand-written HLO module priced by hand, and one real TPU
compile whose matmul FLOPs the parser must find as the jaxpr count and XLA's cost analysis do."""
from __future__ import annotations

import importlib
import importlib.util
import math

import pytest

from sao.aot import hlo_cost, hlo_flops, hlo_text
from sao.aot.tpu_topology import CHIPS, Chip

# Round numbers to price by hand: 1 TFLOP/s, 1 TB/s HBM, ICI 6 GB/s over 6 links → a 1 GB/s ring.
CHIP = Chip("test", "test", 1 << 30, 1e12, 1e12, "", 6e9, 6)
STEPS = 5  # the loop's trip count

# A scan over 5 layers: slice layer i of the stacked input, matmul it with w (an output fusion), all-reduce the
# product over groups of 4 chips, add it to the carry (backward of a norm), and write the carry into row i of the
# stacked output in place (a remat recompute of the shared expert).
HLO = """HloModule test, is_scheduled=true

FileNames
1 "/x/sao/models/transformer.py"

FunctionNames
1 "DecoderLayer.__call__"

FileLocations
1 {file_name_id=1 function_name_id=1 line=3 end_line=3 column=1 end_column=2}

StackFrames
1 {file_location_id=1 parent_frame_id=1}

%fused_slice (param_0.2: f32[5,64,128], param_1.2: s32[]) -> f32[64,128] {
  %param_0.2 = f32[5,64,128]{2,1,0} parameter(0)
  %param_1.2 = s32[]{:T(128)} parameter(1)
  %zero.2 = s32[] constant(0)
  %ds = f32[1,64,128]{2,1,0} dynamic-slice(%param_0.2, %param_1.2, %zero.2, %zero.2), dynamic_slice_sizes={1,64,128}
  ROOT %bc = f32[64,128]{1,0} bitcast(%ds)
}

%fused_dot (param_0: f32[64,128], param_1: f32[128,256]) -> f32[64,256] {
  %param_0 = f32[64,128]{1,0} parameter(0)
  %param_1 = f32[128,256]{1,0} parameter(1)
  ROOT %dot.1 = f32[64,256]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_add (param_0.1: f32[64,256], param_1.1: f32[64,256]) -> f32[64,256] {
  %param_0.1 = f32[64,256]{1,0} parameter(0)
  %param_1.1 = f32[64,256]{1,0} parameter(1)
  ROOT %add.1 = f32[64,256]{1,0} add(%param_0.1, %param_1.1)
}

%fused_update (param_0.3: f32[5,64,256], param_1.3: f32[64,256], param_2.3: s32[]) -> f32[5,64,256] {
  %param_0.3 = f32[5,64,256]{2,1,0} parameter(0)
  %param_1.3 = f32[64,256]{1,0} parameter(1)
  %param_2.3 = s32[] parameter(2)
  %zero.3 = s32[] constant(0)
  %row = f32[1,64,256]{2,1,0} bitcast(%param_1.3)
  ROOT %dus = f32[5,64,256]{2,1,0} dynamic-update-slice(%param_0.3, %row, %param_2.3, %zero.3, %zero.3)
}

%sum (sx: f32[], sy: f32[]) -> f32[] {
  %sx = f32[] parameter(0)
  %sy = f32[] parameter(1)
  ROOT %add.2 = f32[] add(%sx, %sy)
}

%body (p: (s32[], f32[5,64,128], f32[128,256], f32[64,256], f32[5,64,256])) -> (s32[], f32[5,64,128], f32[128,256], f32[64,256], f32[5,64,256]) {
  %p = (s32[], f32[5,64,128]{2,1,0}, f32[128,256]{1,0}, /*index=3*/f32[64,256]{1,0}, f32[5,64,256]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %xs = f32[5,64,128]{2,1,0} get-tuple-element(%p), index=1
  %w = f32[128,256]{1,0} get-tuple-element(%p), index=2
  %acc = f32[64,256]{1,0} get-tuple-element(%p), index=3
  %ys = f32[5,64,256]{2,1,0} get-tuple-element(%p), index=4
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %fusion.s = f32[64,128]{1,0} fusion(%xs, %i), kind=kLoop, calls=%fused_slice, metadata={op_name="jit(step)/model/while/body/jit(dynamic_index_in_dim)/dynamic_slice" stack_frame_id=1}
  %fusion.d = f32[64,256]{1,0} fusion(%fusion.s, %w), kind=kOutput, calls=%fused_dot, metadata={op_name="jit(step)/model/while/body/closed_call/DecoderLayer/self_attn/q_proj/dot_general" stack_frame_id=1}
  %all-reduce.1 = f32[64,256]{1,0} all-reduce(%fusion.d), channel_id=1, replica_groups=[2,4]<=[8], use_global_device_ids=true, to_apply=%sum, metadata={op_name="jit(step)/model/while/body/closed_call/DecoderLayer/self_attn/psum"}
  %fusion.a = f32[64,256]{1,0} fusion(%all-reduce.1, %acc), kind=kLoop, calls=%fused_add, metadata={op_name="jit(step)/transpose(jvp(model))/while/body/DecoderLayer/post_attention_layernorm/add"}
  %fusion.u = f32[5,64,256]{2,1,0} fusion(%ys, %fusion.a, %i), kind=kLoop, calls=%fused_update, metadata={op_name="jit(step)/model/while/body/checkpoint/rematted_computation/DecoderLayer/mlp/shared_expert/up_proj/dynamic_update_slice"}
  ROOT %t = (s32[], f32[5,64,128]{2,1,0}, f32[128,256]{1,0}, /*index=3*/f32[64,256]{1,0}, f32[5,64,256]{2,1,0}) tuple(%next, %xs, %w, %fusion.a, %fusion.u)
}

%cond (q: (s32[], f32[5,64,128], f32[128,256], f32[64,256], f32[5,64,256])) -> pred[] {
  %q = (s32[], f32[5,64,128]{2,1,0}, f32[128,256]{1,0}, /*index=3*/f32[64,256]{1,0}, f32[5,64,256]{2,1,0}) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

ENTRY %main (xs0: f32[5,64,128], w0: f32[128,256], acc0: f32[64,256], ys0: f32[5,64,256]) -> f32[5,64,256] {
  %xs0 = f32[5,64,128]{2,1,0} parameter(0)
  %w0 = f32[128,256]{1,0} parameter(1)
  %acc0 = f32[64,256]{1,0} parameter(2)
  %ys0 = f32[5,64,256]{2,1,0} parameter(3)
  %zero = s32[] constant(0)
  %tuple.0 = (s32[], f32[5,64,128]{2,1,0}, f32[128,256]{1,0}, /*index=3*/f32[64,256]{1,0}, f32[5,64,256]{2,1,0}) tuple(%zero, %xs0, %w0, %acc0, %ys0)
  %while.0 = (s32[], f32[5,64,128]{2,1,0}, f32[128,256]{1,0}, /*index=3*/f32[64,256]{1,0}, f32[5,64,256]{2,1,0}) while(%tuple.0), condition=%cond, body=%body
  ROOT %out = f32[5,64,256]{2,1,0} get-tuple-element(%while.0), index=4
}
"""


def _by_name(result):
  return {o.name: o for o in result.ops}


def test_hand_written_module_is_priced_by_hand():
  result = hlo_cost.breakdown(hlo_text.parse_module(HLO), CHIP)
  ops = _by_name(result)
  assert set(ops) == {"next", "fusion.s", "fusion.d", "all-reduce.1", "fusion.a", "fusion.u", "lt"}
  assert all(ops[n].count == STEPS for n in ops if n != "lt") and ops["lt"].count == STEPS + 1

  dot = ops["fusion.d"]  # [64, 128] @ [128, 256] in f32: 2·64·256·128 FLOPs, both inputs and the output in HBM
  assert dot.flops == 2 * 64 * 256 * 128 and dot.bytes == 4 * (64 * 128 + 128 * 256 + 64 * 256)
  assert (dot.kind, dot.bound, dot.part, dot.phase) == ("matmul", "compute", "attention", "forward")
  assert dot.seconds == pytest.approx(dot.flops / 1e12)

  reduce = ops["all-reduce.1"]  # 64 KiB over groups of 4: 2·(4−1)/4 of it through a 1 GB/s ring
  assert (reduce.kind, reduce.bound, reduce.group_size, reduce.bytes) == ("collective", "ici", 4, 4 * 64 * 256)
  assert reduce.seconds == pytest.approx(2 * 3 / 4 * 4 * 64 * 256 / 1e9)

  add = ops["fusion.a"]  # two operands and the result, memory-bound
  assert (add.kind, add.bound, add.part, add.phase) == ("elementwise", "memory", "norms", "backward")
  assert add.bytes == 3 * 4 * 64 * 256 and add.seconds == pytest.approx(add.bytes / 1e12)

  sliced = ops["fusion.s"]  # reads one layer of the stacked input (and the index), not all five
  assert sliced.bytes == 2 * 4 * 64 * 128 + 4 and (sliced.kind, sliced.part) == ("copy/transpose", "layer scan")
  update = ops["fusion.u"]  # writes one row in place: the row in, the row out, the index
  assert update.bytes == 2 * 4 * 64 * 256 + 4
  assert (update.kind, update.part, update.phase) == ("copy/transpose", "shared expert", "recompute")

  per_step = sum(ops[n].seconds for n in ops if n != "lt")
  assert result.total() == pytest.approx(STEPS * per_step + (STEPS + 1) * ops["lt"].seconds)
  assert result.flops_once == dot.flops and sum(o.count * o.flops for o in result.ops) == STEPS * dot.flops
  assert result.share("kind")["collective"] == pytest.approx(STEPS * reduce.seconds)
  assert not result.unknown_trip_counts and not result.unknown_custom_calls


def test_trip_counts_known_or_derived():
  module = hlo_text.parse_module(HLO)
  entry = module.computations[module.entry]
  assert hlo_text.trip_count(module, entry, entry.by_name["while.0"]) == (5, "derived from the loop condition")
  known_trip_count = 'backend_config={"known_trip_count":{"n":"3"}}'
  known = hlo_text.parse_module(HLO.replace("condition=%cond, body=%body",
                                            f"condition=%cond, body=%body, {known_trip_count}"))
  entry = known.computations[known.entry]
  assert hlo_text.trip_count(known, entry, entry.by_name["while.0"]) == (3, "known_trip_count")
  # A counter that starts at 2 and a bound of 11 with `<=`: 2, 3, …, 11 is 10 iterations.
  shifted = HLO.replace("%zero = s32[] constant(0)", "%zero = s32[] constant(2)").replace(
      "%n = s32[] constant(5)", "%n = s32[] constant(11)").replace("direction=LT", "direction=LE")
  module = hlo_text.parse_module(shifted)
  entry = module.computations[module.entry]
  assert hlo_text.trip_count(module, entry, entry.by_name["while.0"])[0] == 10
  # A counter whose update XLA copies before the loop's tuple (as with --xla_tpu_enable_async_collective_fusion).
  copied = hlo_text.parse_module(HLO.replace("%next = s32[] add(%i, %one)", "%sum1 = s32[] add(%i, %one)\n"
                                             "  %next = s32[] copy(%sum1)"))
  entry = copied.computations[copied.entry]
  assert hlo_text.trip_count(copied, entry, entry.by_name["while.0"]) == (5, "derived from the loop condition")
  # A loop whose bound is not a constant is counted once and listed.
  opaque = hlo_text.parse_module(HLO.replace("%n = s32[] constant(5)", "%n = s32[] get-tuple-element(%q), index=0"))
  result = hlo_cost.breakdown(opaque, CHIP)
  assert len(result.unknown_trip_counts) == 1 and "while.0" in result.unknown_trip_counts[0]


def test_replica_groups_in_each_spelling():
  def size(groups: str) -> int:
    inst = hlo_text.parse_instruction(f"  %ag = f32[8]{{0}} all-gather(%x), replica_groups={groups}, dimensions={{0}}")
    return hlo_cost.group_size(inst)
  assert size("{{0,1,2,3},{4,5,6,7}}") == 4
  assert size("[8,16]<=[128]") == 16
  assert size("mesh['axis_0'=1,'axis_1'=8,'axis_2'=1,'axis_3'=16] {'axis_1'}") == 8
  assert size("mesh['axis_0'=8,'axis_1'=16] {'axis_0','axis_1'}") == 128
  assert size("mesh['axis_0'=1,'axis_1'=16,'axis_2'=1,'axis_3'=8], device_ids=([8,16]T(1,0)) {'axis_1'}") == 16
  assert size("mesh['axis_0'=1,'axis_1'=8,'axis_2'=16], device_ids=([8,8,2]T(1,0,2)) {'axis_2':(8)2}") == 2
  with pytest.raises(ValueError, match="replica groups"):
    size("???")


def test_batched_matmul_as_dilated_convolution_counts_real_taps():
  """XLA on TPU writes a batched matmul as a convolution whose batch dims are spatial dims with a window the size of
  the input over a dilated input: only one tap per output position lands on data (8 batches of [8,16] @ [16,32])."""
  comp = hlo_text.Computation("c", [
      hlo_text.parse_instruction("  %l = f32[4,2,8,16]{3,2,1,0} parameter(0)"),
      hlo_text.parse_instruction("  %r = f32[4,2,32,16]{3,2,1,0} parameter(1)"),
      hlo_text.parse_instruction("  ROOT %c = f32[4,2,8,32]{3,2,1,0} convolution(%l, %r), "
                                 "window={size=4x2 stride=3x1 lhs_dilate=4x2}, dim_labels=01bf_01oi->01bf")], False)
  assert hlo_flops.conv_flops(comp.by_name["c"], comp) == 8 * 2 * 8 * 16 * 32


def test_megablox_kernels_from_their_shapes_and_unknown_kernels_listed():
  def module(kernel: str, out: str, operands: str) -> str:
    return ("HloModule m\n\nENTRY %main (a: bf16[1024,256], b: bf16[4,64,256], c: s32[4]) -> bf16[1] {\n"
            "  %a = bf16[1024,256]{1,0} parameter(0)\n  %b = bf16[4,64,256]{2,1,0} parameter(1)\n"
            "  %c = s32[4]{0} parameter(2)\n  %d = bf16[1024,64]{1,0} parameter(3)\n"
            f"  ROOT %{kernel} = {out} custom-call({operands}), custom_call_target=\"tpu_custom_call\", "
            f"metadata={{op_name=\"jit(step)/mlp/shard_map/jit({kernel})/pallas_call\"}}\n}}\n")
  gmm = hlo_cost.breakdown(hlo_text.parse_module(module("gmm", "bf16[1024,64]{1,0}", "%c, %a, %b")), CHIP)
  assert gmm.ops[0].flops == 2 * 1024 * 256 * 64 and gmm.ops[0].part == "MoE experts"  # transposed rhs [G, n, k]
  tgmm = hlo_cost.breakdown(hlo_text.parse_module(module("tgmm", "bf16[4,256,64]{2,1,0}", "%c, %a, %d")), CHIP)
  assert tgmm.ops[0].flops == 2 * 1024 * 256 * 64
  other = hlo_cost.breakdown(hlo_text.parse_module(module("splash_fwd", "bf16[1024,64]{1,0}", "%a, %b")), CHIP)
  assert other.ops[0].flops == 0 and other.unknown_custom_calls == {"splash_fwd": 1}


def test_megablox_priced_by_the_local_groups_rows_under_expert_parallelism():
  """With a quarter of its 8,192 rows in its 4 local groups, a gmm runs 2,048 rows plus one 512-row tile per group:
  half the FLOPs of the kernel's static estimate, and half the bytes of every array but the stacked weights."""
  text = ("HloModule m\n\nENTRY %main (a: bf16[8192,256], b: bf16[4,64,256], c: s32[4]) -> bf16[1] {\n"
          "  %a = bf16[8192,256]{1,0} parameter(0)\n  %b = bf16[4,64,256]{2,1,0} parameter(1)\n"
          "  %c = s32[4]{0} parameter(2)\n"
          "  ROOT %gmm = bf16[8192,64]{1,0} custom-call(%c, %a, %b), custom_call_target=\"tpu_custom_call\", "
          "metadata={op_name=\"jit(step)/mlp/shard_map/jit(gmm)/pallas_call\"}\n}\n")
  module = hlo_text.parse_module(text)
  full, local = (hlo_cost.breakdown(module, CHIP, share).ops[0] for share in (1.0, 0.25))
  assert full.flops == 2 * 8192 * 256 * 64 and local.flops == full.flops / 2
  stacked = 4 * 64 * 256 * 2
  assert local.bytes == pytest.approx(stacked + (full.bytes - stacked) / 2)
  assert hlo_cost.breakdown(module, CHIP, 1 / 64).ops[0].flops == 2 * (128 + 4 * 512) * 256 * 64
  with pytest.raises(ValueError, match="grouped_row_share"):
    hlo_cost.breakdown(module, CHIP, 0.0)


def test_active_grouped_rows_matches_what_megablox_grid_visits():
  """The rows the megablox kernels' grid visits (jax's own `make_group_metadata`: active row tiles × the row tile)
  for the local groups of an expert shard under balanced random routing, against `active_grouped_rows`: within
  5 % of it; our row tile is the one `sao.models.grouped_matmul` passes."""
  np = pytest.importorskip("numpy")
  jnp = pytest.importorskip("jax.numpy")
  megablox = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")  # the module, not its gmm
  from sao.models import grouped_matmul  # pylint: disable=g-import-not-at-top
  assert grouped_matmul._megablox_tiling(1 << 20, 1024, 1024)[0] == hlo_flops.MEGABLOX_ROW_TILE
  rng = np.random.default_rng(0)
  for experts, shards, rows in ((128, 8, 1 << 16), (128, 4, 1 << 16), (64, 16, 1 << 17)):
    local = experts // shards
    assigned = np.bincount(rng.integers(0, experts, rows), minlength=experts)[:local]
    tile = hlo_flops.MEGABLOX_ROW_TILE
    _, tiles = megablox.make_group_metadata(group_sizes=jnp.asarray(assigned, jnp.int32), m=rows, tm=tile,
                                            start_group=jnp.asarray(0, jnp.int32), num_nonzero_groups=local,
                                            visit_empty_groups=False)
    visited = int(tiles) * tile
    estimate = hlo_flops.active_grouped_rows(rows, local, 1 / shards)
    assert abs(visited - estimate) <= 0.05 * estimate, (experts, shards, visited, estimate)


def test_splash_kernels_priced_from_their_shapes_across_a_multi_line_attribute():
  """Splash attention's three kernels as a TPU compile prints them (operands: block-mask info, q [G, T, D], k, v
  [S, D], segment ids; a `kernel_metadata` frontend attribute whose value spans three lines): forward 4·n·S·D,
  dq 6·n·S·D, dkv 8·n·S·D (n = G·T query rows) times the causal share of 512-tiles (2 × 2 tiles: 3 of 4
  visible), each attributed to attention."""
  def kernel(name: str, out: str, blocks: str) -> str:
    metadata = ", ".join(f'\\"block_{b}\\": 512' for b in blocks.split())
    return (f"  %{name}.1 = {out} custom-call(%m, %q, %k, %v, %s), custom_call_target=\"tpu_custom_call\", "
            "frontend_attributes={kernel_metadata={\n"
            f'"xprof_metadata":"{{{metadata}, \\"q_layout\\": 1}}"\n'
            f"}}}}, metadata={{op_name=\"jit(step)/DecoderLayer/self_attn/shard_map/{name}/pallas_call\"}}\n")
  text = ("HloModule m\n\nENTRY %main (m: s8[1,2,2], q: bf16[2,1024,128], k: bf16[1024,128], v: bf16[1024,128], "
          "s: s32[1024,128]) -> f32[1] {\n  %m = s8[1,2,2]{2,1,0} parameter(0)\n"
          "  %q = bf16[2,1024,128]{2,1,0} parameter(1)\n  %k = bf16[1024,128]{1,0} parameter(2)\n"
          "  %v = bf16[1024,128]{1,0} parameter(3)\n  %s = s32[1024,128]{1,0} parameter(4)\n"
          + kernel("splash_mqa_fwd_segmented_residuals", "(bf16[2,1024,128]{2,1,0}, f32[2,1024,128]{2,1,0})",
                   "q kv")
          + kernel("splash_mqa_dq_segmented_no_residuals", "bf16[2,1024,128]{2,1,0}", "q_dq kv_dq")
          + kernel("splash_mqa_dkv_segmented_no_residuals", "(bf16[1024,128]{1,0}, bf16[1024,128]{1,0})",
                   "q_dkv kv_dkv")
          + "  ROOT %r = f32[1]{0} constant({0})\n}\n")
  result = hlo_cost.breakdown(hlo_text.parse_module(text), CHIP)
  unit = 2 * 1024 * 1024 * 128 * 3 / 4
  assert [(o.detail, o.flops, o.part) for o in result.ops] == [
      ("splash_mqa_fwd_segmented_residuals", 4 * unit, "attention"),
      ("splash_mqa_dq_segmented_no_residuals", 6 * unit, "attention"),
      ("splash_mqa_dkv_segmented_no_residuals", 8 * unit, "attention")]
  assert not result.unknown_custom_calls
  q_bytes, kv_bytes = 2 * 1024 * 128 * 2, 1024 * 128 * 2
  assert result.ops[1].bytes == 4 + 2 * q_bytes + 2 * kv_bytes + 1024 * 128 * 4  # operands, then dq
  assert hlo_flops.causal_tile_fraction(32768, 512, 512) == 65 / 128  # 64 × 65 / 2 of 64² tiles
  assert hlo_flops.causal_tile_fraction(1000, 512, 256) == 6 / 8  # ragged last tiles: row 0 sees 2, row 1 all 4


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed")
def test_a_real_tpu_compile_matches_the_jaxpr_count_and_xla():
  """A 6-layer scanned MLP's value_and_grad, batch sharded over a v5p:2x2x1 (4 chips): the parser's matmul FLOPs
  per chip × 4 equal the jaxpr's count of the whole program (loops multiplied out) within 2 %, and with loop bodies
  counted once they are within 2 % of XLA's cost analysis (which counts elementwise FLOPs too, so ≥ ours)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from sao.aot import compile_stats, tpu_topology  # pylint: disable=g-import-not-at-top

  chip, devices = tpu_topology.topology_devices("v5p:2x2x1")
  mesh = Mesh(np.array(devices).reshape(4), ("batch",))
  layers, batch, width = 6, 512, 256

  def loss(w, x):
    h, _ = jax.lax.scan(lambda h, wl: (jax.numpy.tanh(h @ wl), None), x, w)
    return (h * h).sum()

  step = jax.value_and_grad(loss)
  w = jax.ShapeDtypeStruct((layers, width, width), "float32", sharding=NamedSharding(mesh, P()))
  x = jax.ShapeDtypeStruct((batch, width), "float32", sharding=NamedSharding(mesh, P("batch")))
  compiled = jax.jit(step).lower(w, x).compile()
  result = hlo_cost.breakdown(hlo_text.parse_module(compiled.as_text()), chip)
  program = compile_stats.program_flops(step, w, x)
  assert program == 3 * layers * 2 * batch * width * width  # forward, d/dh and d/dw
  parsed = 4 * sum(o.count * o.flops for o in result.ops)
  assert parsed == pytest.approx(program, rel=0.02), (parsed, program)
  cost = compiled.cost_analysis()
  xla_flops = float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])
  assert result.flops_once <= xla_flops * 1.02 and result.flops_once == pytest.approx(xla_flops, rel=0.1)
  assert result.share("kind")["collective"] > 0  # the weight gradient's all-reduce over the batch shards
  assert not result.unknown_trip_counts and math.isfinite(result.total())
  assert CHIPS["v5p"].ici_ring_bytes_per_second == 200e9


def test_breakdown_command_prints_shares_and_top_instructions(tmp_path):
  """`experiments/bench/hlo_breakdown.py`'s table for the hand-written module, with the report row it finds by file
  name."""
  import json  # pylint: disable=g-import-not-at-top
  from experiments.bench import hlo_breakdown  # pylint: disable=g-import-not-at-top
  hlo = tmp_path / "actor_step_dis_T64.hlo.txt"
  hlo.write_text(HLO)
  report = tmp_path / "rows.json"
  report.write_text(json.dumps([{"program": "actor_step_dis", "bucket": 64, "chips": 4, "analytic_flops": 4e7,
                                 "xla_flops": 4.3e7, "estimated_seconds": 1e-3}]))
  row = hlo_breakdown.report_row(str(report), str(hlo))
  result = hlo_cost.breakdown(hlo_text.read_module(str(hlo)), CHIP)
  text = hlo_breakdown.format_breakdown(result, CHIP, int(row["chips"]), row["analytic_flops"], row, top=3)
  seconds = result.total()
  assert f"{seconds:12.3f} s      MFU {100 * 4e7 / (seconds * 4 * 1e12):.1f}%" in text
  for heading in ("by kind", "by model part", "by phase", "by bound", "top 3 instructions"):
    assert heading in text
  top = text.split("top 3 instructions")[1].splitlines()[2]  # the all-reduce: the most expensive instruction
  assert "all-reduce.1" in top and "DecoderLayer/self_attn/psum" in top
  with pytest.raises(ValueError, match="no row for actor_step_dis at T=128"):
    hlo_breakdown.report_row(str(report), str(tmp_path / "actor_step_dis_T128.hlo.txt.gz"))


# A GPU program as XLA's GPU compiler writes it (the formats of XLA's own GPU tests): a cuBLAS gemm whose result is
# a (product, workspace) tuple, and cuDNN's fused attention forward and backward under a causal mask, BTNH layout.
B, T, N, H = 2, 256, 4, 64
_FMHA_CONFIG = ('backend_config={"operation_queue_id":"0","cudnn_fmha_backend_config":{"fmha_scale":0.125,'
                '"intermediate_tensor_shape":{"element_type":"BF16","dimensions":["%d","%d","%d","%d"],'
                '"tuple_shapes":[],"layout":{"minor_to_major":["3","2","1","0"]}},"is_flash_attention":true,'
                '"mask_type":"CAUSAL"}}' % (B, N, T, T))
GPU_HLO = f"""HloModule gpu, is_scheduled=true

ENTRY %main (x: bf16[512,1024], w: bf16[1024,2048], q: bf16[{B},{T},{N},{H}], k: bf16[{B},{T},{N},{H}], v: bf16[{B},{T},{N},{H}], do: bf16[{B},{T},{N},{H}]) -> bf16[512,2048] {{
  %x = bf16[512,1024]{{1,0}} parameter(0)
  %w = bf16[1024,2048]{{1,0}} parameter(1)
  %q = bf16[{B},{T},{N},{H}]{{3,2,1,0}} parameter(2)
  %k = bf16[{B},{T},{N},{H}]{{3,2,1,0}} parameter(3)
  %v = bf16[{B},{T},{N},{H}]{{3,2,1,0}} parameter(4)
  %do = bf16[{B},{T},{N},{H}]{{3,2,1,0}} parameter(5)
  %gemm = (bf16[512,2048]{{1,0}}, s8[4194304]{{0}}) custom-call(%x, %w), custom_call_target="__cublas$gemm", backend_config={{"operation_queue_id":"0","gemm_backend_config":{{"alpha_real":1,"beta":0,"dot_dimension_numbers":{{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}},"epilogue":"DEFAULT"}}}}, metadata={{op_name="jit(step)/model/DecoderLayer/mlp/up_proj/dot_general"}}
  %fwd = (bf16[{B},{T},{N},{H}]{{3,2,1,0}}, f32[{B},{N},{T}]{{2,1,0}}, u8[0]{{0}}) custom-call(%q, %k, %v), custom_call_target="__cudnn$fmhaSoftmax", {_FMHA_CONFIG}, metadata={{op_name="jit(step)/model/DecoderLayer/self_attn/dot_product_attention"}}
  %bwd = (bf16[{B},{T},{N},{H}]{{3,2,1,0}}, bf16[{B},{T},{N},{H}]{{3,2,1,0}}, bf16[{B},{T},{N},{H}]{{3,2,1,0}}, u8[0]{{0}}) custom-call(%q, %k, %v, %do), custom_call_target="__cudnn$fmhaSoftmaxBackward", {_FMHA_CONFIG}, metadata={{op_name="jit(step)/transpose(jvp(model))/DecoderLayer/self_attn/dot_product_attention"}}
  ROOT %out = bf16[512,2048]{{1,0}} get-tuple-element(%gemm), index=0
}}
"""


def test_gpu_library_calls_are_priced_as_the_matmuls_they_run():
  h200 = tpu_topology_chip("h200")
  result = hlo_cost.breakdown(hlo_text.parse_module(GPU_HLO), h200)
  ops = _by_name(result)
  assert set(ops) == {"gemm", "fwd", "bwd"} and not result.unknown_custom_calls
  gemm = ops["gemm"]
  assert gemm.flops == 2 * 512 * 2048 * 1024 and gemm.part == "MLP"
  assert gemm.bytes == 2 * (512 * 1024 + 1024 * 2048 + 512 * 2048) + 4194304  # operands, result, workspace
  causal = 0.5  # the kernel skips the masked half of the score blocks
  assert ops["fwd"].flops == 4 * B * N * T * T * H * causal
  assert ops["bwd"].flops == 10 * B * N * T * T * H * causal
  assert (ops["fwd"].phase, ops["bwd"].phase, ops["bwd"].part) == ("forward", "backward", "attention")
  assert result.flops_once == gemm.flops + ops["fwd"].flops + ops["bwd"].flops
  assert gemm.seconds == pytest.approx(max(gemm.flops / 989e12, gemm.bytes / 4.8e12))


def tpu_topology_chip(name):
  from sao.aot import tpu_topology  # pylint: disable=g-import-not-at-top
  return tpu_topology.chip_named(name)


def test_an_unknown_gpu_library_call_is_listed_by_name():
  text = GPU_HLO.replace("__cudnn$fmhaSoftmaxBackward", "__cudnn$somethingNew")
  result = hlo_cost.breakdown(hlo_text.parse_module(text), tpu_topology_chip("h200"))
  assert result.unknown_custom_calls == {"__cudnn$somethingNew": 1}


def test_conditionals_priced_by_the_costliest_branch_with_the_cheapest_beside_it():
  """A conditional whose branches are a [64,128] @ [128,256] dot and a negate: the sum counts the dot's branch, and
  `conditional_savings` is the difference to the negate's (nested inside the cheap branch: a second conditional
  whose own cheapest branch counts for the lower bound)."""
  text = """HloModule m

%costly (a: f32[64,128], b: f32[128,256]) -> f32[64,256] {
  %a = f32[64,128]{1,0} parameter(0)
  %b = f32[128,256]{1,0} parameter(1)
  ROOT %d = f32[64,256]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%cheap_inner (a.1: f32[64,128], b.1: f32[128,256]) -> f32[64,256] {
  %a.1 = f32[64,128]{1,0} parameter(0)
  %b.1 = f32[128,256]{1,0} parameter(1)
  %zero = f32[] constant(0)
  ROOT %z = f32[64,256]{1,0} broadcast(%zero), dimensions={}
}

%middle (a.2: f32[64,128], b.2: f32[128,256]) -> f32[64,256] {
  %a.2 = f32[64,128]{1,0} parameter(0)
  %b.2 = f32[128,256]{1,0} parameter(1)
  %p.2 = pred[] constant(true)
  %inner = f32[64,256]{1,0} conditional(%p.2, %a.2, %b.2), true_computation=%costly, false_computation=%cheap_inner
  ROOT %n = f32[64,256]{1,0} negate(%inner)
}

ENTRY %main (x: f32[64,128], w: f32[128,256], i: s32[]) -> f32[64,256] {
  %x = f32[64,128]{1,0} parameter(0)
  %w = f32[128,256]{1,0} parameter(1)
  %i = s32[] parameter(2)
  ROOT %c = f32[64,256]{1,0} conditional(%i, %x, %w), branch_computations={%costly, %middle}
}
"""
  result = hlo_cost.breakdown(hlo_text.parse_module(text), CHIP)
  dot = max(2 * 64 * 128 * 256 / CHIP.peak_bf16_flops,
            (64 * 128 + 128 * 256 + 64 * 256) * 4 / CHIP.hbm_bytes_per_second)
  negate = 2 * 64 * 256 * 4 / CHIP.hbm_bytes_per_second
  zeros = 64 * 256 * 4 / CHIP.hbm_bytes_per_second
  # Costliest: `middle` with its inner dot (dot + negate) over `costly` (dot); cheapest: `middle` with zeros.
  assert result.total() == pytest.approx(dot + negate)
  assert result.conditional_seconds == pytest.approx(dot + negate)
  # (the scalar constant's 4 bytes aside)
  assert result.total() - result.conditional_savings == pytest.approx(min(dot, zeros + negate), rel=1e-4)


def test_grouped_row_share_follows_the_program():
  from sao.aot import instruction_time  # pylint: disable=g-import-not-at-top
  assert instruction_time.grouped_row_share(1, 0.0) == (1.0, "")
  assert instruction_time.grouped_row_share(8, 0.0)[0] == 1 / 8
  assert instruction_time.grouped_row_share(8, 2.0)[0] == 0.5  # a chunk of 2 × the share
  assert instruction_time.grouped_row_share(8, 0.5)[0] == 1.0
  with pytest.raises(ValueError, match="expert shards 0"):
    instruction_time.grouped_row_share(0, 0.0)
