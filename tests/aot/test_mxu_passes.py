"""`hlo_flops.mxu_passes`: an f32 matmul at `highest` operand precision runs 6 bf16 passes on the TPU's matrix unit
and at `high` 3 (`jax.lax.Precision`'s docstring); `hlo_cost` prices its compute time by FLOPs × passes while its
FLOPs (the MFU numerator) stay the matmul's."""
from __future__ import annotations

import pytest

from sao.aot import hlo_cost, hlo_flops, hlo_text
from sao.aot.tpu_topology import Chip

CHIP = Chip("test", "test", 1 << 30, 1e12, 1e15, "", 6e9, 6)  # 1 TFLOP/s, HBM so fast that matmuls are compute-bound


def _module(dtype: str, precision: str) -> str:
  attribute = f", operand_precision={{{precision},{precision}}}" if precision else ""
  return (f"HloModule m\n\nENTRY %main (a: {dtype}[256,512], b: {dtype}[512,128]) -> f32[256,128] {{\n"
          f"  %a = {dtype}[256,512]{{1,0}} parameter(0)\n  %b = {dtype}[512,128]{{1,0}} parameter(1)\n"
          f"  ROOT %d = f32[256,128]{{1,0}} dot(%a, %b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}"
          f"{attribute}\n}}\n")


@pytest.mark.parametrize("dtype,precision,passes", [("f32", "highest", 6), ("f32", "high", 3), ("f32", "default", 1),
                                                    ("f32", "", 1), ("bf16", "highest", 1)])
def test_passes_by_operand_precision_and_dtype(dtype, precision, passes):
  result = hlo_cost.breakdown(hlo_text.parse_module(_module(dtype, precision)), CHIP)
  (op,) = result.ops
  flops = 2 * 256 * 512 * 128
  assert op.flops == flops and op.mxu_flops == passes * flops
  assert op.seconds == pytest.approx(passes * flops / CHIP.peak_bf16_flops) and op.bound == "compute"


def test_an_explicit_dot_algorithm_names_its_passes():
  module = hlo_text.parse_module(_module("f32", "").replace("rhs_contracting_dims={0}", "rhs_contracting_dims={0}, "
                                                            "algorithm=dot_bf16_bf16_f32_x3"))
  comp = module.computations[module.entry]
  assert hlo_flops.mxu_passes(comp.by_name["d"], comp) == 3


def test_a_real_tpu_compile_keeps_the_precision_and_is_priced_six_times():
  """XLA:TPU keeps `operand_precision={highest,highest}` on an f32 matmul asked at HIGHEST: the compute-bound
  matmul is priced at 6 × the DEFAULT one's time on a v5p."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.sharding import SingleDeviceSharding  # pylint: disable=g-import-not-at-top
  from sao.aot import tpu_topology  # pylint: disable=g-import-not-at-top

  chip, devices = tpu_topology.topology_devices("v5p:2x2x1")
  x = jax.ShapeDtypeStruct((4096, 4096), jnp.float32, sharding=SingleDeviceSharding(devices[0]))
  seconds = {}
  for precision in (jax.lax.Precision.DEFAULT, jax.lax.Precision.HIGHEST):
    text = jax.jit(lambda a, b, p=precision: jnp.dot(a, b, precision=p)).lower(x, x).compile().as_text()
    result = hlo_cost.breakdown(hlo_text.parse_module(text), chip)
    seconds[precision] = sum(o.total_seconds for o in result.ops if o.flops)
    assert sum(o.count * o.flops for o in result.ops) == 2 * 4096 ** 3
  assert seconds[jax.lax.Precision.HIGHEST] == pytest.approx(6 * seconds[jax.lax.Precision.DEFAULT], rel=0.01)
