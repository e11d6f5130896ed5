"""`experiments/bench/compile_layer.py`: one token-mixer block's forward + backward compiled for a small TPU topology
(v5p:2x2x1 through libtpu; skipped without it) with the learner's sharding rules."""
from __future__ import annotations

import importlib.util

import pytest

from experiments.bench import compile_layer

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu is not installed (pip install -e '.[test]' installs it)")


def test_parse_mesh():
  assert compile_layer.parse_mesh("fsdp=8,tensor=-1") == {"fsdp": 8, "tensor": -1}
  with pytest.raises(ValueError, match="axis=size"):
    compile_layer.parse_mesh("fsdp:8")


@needs_libtpu
@pytest.mark.parametrize("block", ["linear_attention", "full_attention"])
def test_compiles_one_block_of_a_tiny_hybrid_model(block):
  from sao.aot import tpu_topology  # pylint: disable=g-import-not-at-top
  from sao.train import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  _, devices = tpu_topology.topology_devices("v5p:2x2x1")
  mesh = mesh_lib.make_mesh({"fsdp": 2, "tensor": -1}, devices)
  cfg = compile_layer.model_config("tiny:qwen3_5_moe_text", "bfloat16", "full")
  row = compile_layer.compile_block(cfg, block, mesh, batch=2, length=40)
  assert row.fits and row.error == ""
  assert row.argument_bytes > 0 and row.temp_bytes > 0 and row.xla_flops > 0 and row.xla_bytes_accessed > 0
  assert row.program_flops > 0 and row.largest
  assert "does not fit" not in compile_layer.format_row(row).lower()
  if block == "linear_attention":  # a chip too small for what XLA compiled: reported as not fitting
    small = compile_layer.compile_block(cfg, block, mesh, batch=2, length=40, capacity_bytes=1024)
    assert not small.fits and "compiled, but needs" in small.error


def test_model_overrides_are_typed_and_an_unknown_field_is_named():
  cfg = compile_layer.model_config("tiny:qwen3_5_moe_text", "bfloat16", "full",
                                   ["linear_attn_matmul=bfloat16", "linear_chunk_size=16", "scan_layers=true"])
  assert (cfg.linear_attn_matmul, cfg.linear_chunk_size, cfg.scan_layers) == ("bfloat16", 16, True)
  with pytest.raises(ValueError, match="no field 'chunk'"):
    compile_layer.model_config("tiny:qwen3_5_moe_text", "bfloat16", "full", ["chunk=16"])


@needs_libtpu
def test_a_priced_block_writes_its_hlo_and_bf16_chunk_matmuls_price_below_float32(tmp_path):
  """With a chip the row records the per-instruction sum and the HLO goes to `hlo_dir`; Gated DeltaNet's bf16 chunk
  matmuls (`linear_attn_matmul`) model faster than its f32 HIGHEST ones for the same block."""
  from sao.aot import tpu_topology  # pylint: disable=g-import-not-at-top
  from sao.train import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  chip, devices = tpu_topology.topology_devices("v5p:2x2x1")
  mesh = mesh_lib.make_mesh({"fsdp": 2, "tensor": -1}, devices)
  seconds = {}
  for matmul in ("float32", "bfloat16"):
    cfg = compile_layer.model_config("tiny:qwen3_5_moe_text", "bfloat16", "full", [f"linear_attn_matmul={matmul}"])
    row = compile_layer.compile_block(cfg, "linear_attention", mesh, batch=2, length=256, chip=chip,
                                      hlo_dir=str(tmp_path / matmul))
    assert (tmp_path / matmul / "linear_attention_T256.hlo.txt.gz").is_file()
    seconds[matmul] = row.instruction_seconds
  assert 0 < seconds["bfloat16"] < seconds["float32"], seconds
