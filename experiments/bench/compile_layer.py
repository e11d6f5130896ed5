r"""Compiles the forward + backward of ONE token-mixer block (Gated DeltaNet `linear_attn`, or full `self_attn`) of a
known model for a TPU topology, sharded as the learner shards it, and reports its HBM per chip, XLA's FLOPs and
bytes, and the largest buffers (with the jax operation that made each):

    flock /tmp/tpu_compile.lock nice -n 5 python experiments/bench/compile_layer.py --model=Qwen/Qwen3.5-35B-A3B \
        --topology=v5p:4x4x8 --block=linear_attention --lengths=32768,131072

The program is `vjp` of the block at `[batch, T, hidden]`: given x, the token mask and the output's cotangent dy,
it returns the gradients of the block's params and of x (what one layer of the learner's rematerialised backward
runs for its mixer; `--remat` wraps the block in the model's per-layer checkpoint policy as the learner does).
Params are sharded by `sao.models.sharding` (the learner's rules), x / mask / dy over the batch axes of the mesh
(`--mesh`, default the full configs' fsdp = 8, tensor = the rest). Nothing runs: the topology's devices come from
libtpu (`sao.aot.tpu_topology`), so this works on any machine with libtpu installed. Exits 1 when it does not fit.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Sequence

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import: tests import this module beside other commands
  whose flags share names, e.g. `--topology`, `--batch`)."""
  global _MODEL, _TOPOLOGY, _MESH, _BLOCK, _BATCH, _LENGTHS, _DTYPE  # pylint: disable=global-statement
  global _REMAT, _TOP, _OUT, _HLO_DIR, _OVERRIDES  # pylint: disable=global-statement
  _MODEL = flags.DEFINE_string("model", "Qwen/Qwen3.5-35B-A3B",
                               "A hub id `sao.models.known_configs` knows, or tiny:<model_type> (ModelConfig.tiny).")
  _TOPOLOGY = flags.DEFINE_string("topology", "v5p:4x4x8", "TPU topology, <chip>:<shape>.")
  _MESH = flags.DEFINE_string("mesh", "fsdp=8,tensor=-1", "Mesh axis sizes, axis=size,… (one may be -1).")
  _BLOCK = flags.DEFINE_enum("block", "linear_attention", ["linear_attention", "full_attention"], "Token mixer.")
  _BATCH = flags.DEFINE_integer("batch", 8, "Rows B of the micro-batch.")
  _LENGTHS = flags.DEFINE_list("lengths", ["32768"], "Sequence lengths T to compile.")
  _DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "Param and compute dtype.")
  _REMAT = flags.DEFINE_string("remat", "full", "Per-layer remat policy (sao.models.config.REMAT_POLICIES key).")
  _TOP = flags.DEFINE_integer("top", 5, "How many of the largest buffers to list.")
  _OUT = flags.DEFINE_string("out", "", "Write the rows as JSON here.")
  _HLO_DIR = flags.DEFINE_string("hlo_dir", "", "Write each compiled program's HLO here (<block>_T<length>.hlo.txt.gz), "
                                 "for experiments/bench/hlo_breakdown.py.")
  _OVERRIDES = flags.DEFINE_list("model_override", [], "ModelConfig fields to set, field=value,… (e.g. "
                                 "linear_chunk_size=128): a lever measured against the same block without it.")


GIB = float(1 << 30)


@dataclasses.dataclass
class LayerRow:
  block: str
  length: int
  batch: int
  fits: bool
  argument_bytes: int  # per chip
  temp_bytes: int  # per chip
  output_bytes: int  # per chip
  xla_flops: float  # XLA's cost_analysis() per chip (each loop body counted once)
  xla_bytes_accessed: float  # per chip, likewise
  program_flops: float  # matmul FLOPs of the whole program over all chips, loops multiplied out
  largest: list[dict]
  error: str = ""
  instruction_seconds: float | None = None  # per chip: Σ of the compiled program's priced instructions (hlo_cost)


def model_config(model: str, dtype: str, remat: str, overrides: Sequence[str] = ()):
  """The block's ModelConfig; `overrides` (`field=value`, the value parsed as the field's current type) replace
  fields; ValueError naming an unknown field."""
  from sao.models import known_configs  # pylint: disable=g-import-not-at-top
  from sao.models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  if model.startswith("tiny:"):
    cfg = ModelConfig.tiny(model[len("tiny:"):], dtype=dtype, param_dtype=dtype, remat=remat)
  else:
    cfg = ModelConfig.from_hf(known_configs.hf_config(model), dtype=dtype, param_dtype=dtype, remat=remat)
  changes = {}
  for item in overrides:
    name, _, value = item.partition("=")
    if not hasattr(cfg, name):
      raise ValueError(f"--model_override: ModelConfig has no field {name!r}")
    current = getattr(cfg, name)
    changes[name] = (value.lower() in ("1", "true")) if isinstance(current, bool) else type(current)(value)
  return dataclasses.replace(cfg, **changes) if changes else cfg


def parse_mesh(text: str) -> dict[str, int]:
  """`"fsdp=8,tensor=-1"` → {"fsdp": 8, "tensor": -1}; ValueError naming a malformed entry."""
  shape = {}
  for item in filter(None, text.split(",")):
    name, sep, size = item.partition("=")
    if not sep or not size.lstrip("-").isdigit():
      raise ValueError(f"mesh: {item!r} is not axis=size")
    shape[name.strip()] = int(size)
  return shape


def block_program(cfg, block: str, mesh, batch: int, length: int):
  """(jitted vjp of one block, its abstract sharded args): `(params, x, token_mask, dy) → (dparams, dx)`."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding  # pylint: disable=g-import-not-at-top
  from sao.models import sharding  # pylint: disable=g-import-not-at-top
  from sao.models.attention import AttentionMask  # pylint: disable=g-import-not-at-top
  from sao.models.config import REMAT_POLICIES  # pylint: disable=g-import-not-at-top
  from sao.models.gated_deltanet import GatedDeltaNet  # pylint: disable=g-import-not-at-top
  from sao.models.layers import Attention, dtypes  # pylint: disable=g-import-not-at-top

  dtype, _ = dtypes(cfg)
  module = GatedDeltaNet(cfg) if block == "linear_attention" else Attention(cfg)

  def apply(params, x, token_mask):
    if block == "linear_attention":
      return module.apply({"params": params}, x, token_mask, None)[0]
    positions = jnp.maximum(jnp.cumsum(token_mask, axis=1) - 1, 0)
    return module.apply({"params": params}, x, positions, AttentionMask(token_mask.astype(bool)), None, None)[0]

  if cfg.remat != "none":
    apply = jax.checkpoint(apply, policy=getattr(jax.checkpoint_policies, REMAT_POLICIES[cfg.remat]),
                           prevent_cse=True)

  def fwd_bwd(params, x, token_mask, dy):
    _, pullback = jax.vjp(lambda p, h: apply(p, h, token_mask), params, x)
    return pullback(dy)

  x = jax.ShapeDtypeStruct((batch, length, cfg.hidden_size), dtype)
  mask = jax.ShapeDtypeStruct((batch, length), jnp.int32)
  if block == "linear_attention":
    boxed = jax.eval_shape(lambda: module.init(jax.random.key(0), jnp.zeros(x.shape, x.dtype),
                                               jnp.ones(mask.shape, jnp.int32), None))["params"]
  else:
    boxed = jax.eval_shape(lambda: module.init(jax.random.key(0), jnp.zeros(x.shape, x.dtype),
                                               jnp.zeros(mask.shape, jnp.int32),
                                               AttentionMask(jnp.ones(mask.shape, bool)), None, None))["params"]
  specs = sharding.param_partition_specs(boxed, mesh)
  params = jax.tree.map(lambda leaf, spec: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype,
                                                                sharding=NamedSharding(mesh, spec)),
                        nn.meta.unbox(boxed), specs, is_leaf=lambda v: isinstance(v, jax.ShapeDtypeStruct))
  rows = lambda ndim: sharding.batch_sharding(mesh, ndim, batch)
  args = (params, jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rows(3)),
          jax.ShapeDtypeStruct(mask.shape, mask.dtype, sharding=rows(2)),
          jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rows(3)))
  return jax.jit(fwd_bwd), args


def compile_block(cfg, block: str, mesh, batch: int, length: int, top: int = 5,
                  capacity_bytes: int | None = None, chip=None, hlo_dir: str = "") -> LayerRow:
  """Lowers and compiles `block_program`; a program XLA refuses, or whose arguments + temporaries + outputs exceed
  `capacity_bytes` (the chip's HBM; libtpu may compile such a program), gives `fits=False`. With `chip`, the row
  records the per-instruction serial time (`sao.aot.instruction_time`); with `hlo_dir`, the HLO is written there."""
  from sao.aot import compile_stats  # pylint: disable=g-import-not-at-top
  jitted, args = block_program(cfg, block, mesh, batch, length)
  traced = jitted.trace(*args)
  program_flops = compile_stats.jaxpr_flops(traced.jaxpr)
  lowered = traced.lower()
  compiled, error, report = compile_stats.compile_with_report(lowered, top, prefix="sao_layer_")
  largest = [dataclasses.asdict(b) for b in report.largest] if report else []
  if compiled is None:
    return LayerRow(block, length, batch, False, report.argument_bytes if report else 0,
                    report.temp_bytes if report else 0, report.output_bytes if report else 0, 0.0, 0.0,
                    program_flops, largest, error)
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  total = memory.argument_size_in_bytes + memory.temp_size_in_bytes + memory.output_size_in_bytes
  fits = capacity_bytes is None or total <= capacity_bytes
  error = "" if fits else f"compiled, but needs {total / GIB:.2f} GiB per chip, more than {capacity_bytes / GIB:.2f}"
  seconds = None
  if chip is not None or hlo_dir:
    from sao.aot import driver, instruction_time  # pylint: disable=g-import-not-at-top
    text = compiled.as_text()
    if hlo_dir:
      driver.write_hlo(text, driver.hlo_path(hlo_dir, block, length))
    seconds = instruction_time.serial_seconds(text, chip) if chip is not None else None
  return LayerRow(block, length, batch, fits, memory.argument_size_in_bytes, memory.temp_size_in_bytes,
                  memory.output_size_in_bytes, float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)),
                  program_flops, largest, error, seconds)


def format_row(row: LayerRow) -> str:
  lines = [f"{row.block} T={row.length} B={row.batch}: {'fits' if row.fits else 'DOES NOT FIT'}; per chip GiB: "
           f"args {row.argument_bytes / GIB:.3f}, temp {row.temp_bytes / GIB:.3f}, out {row.output_bytes / GIB:.3f}; "
           f"XLA per chip: {row.xla_flops:.4g} flops, {row.xla_bytes_accessed:.4g} bytes accessed (loop bodies "
           f"once); program matmul flops (all chips, loops multiplied out) {row.program_flops:.4g}"
           + (f"; Σ instructions {row.instruction_seconds:.4f} s per chip" if row.instruction_seconds is not None
              else "")]
  if row.error:
    lines.append(f"  {row.error}")
  lines += [f"  {b['size'] / GIB:8.3f} GiB {b['kind']:<9} {b['shape']:<34} {b['instruction']} {b['op_name'][-100:]}"
            for b in row.largest]
  return "\n".join(lines)


def main(argv):
  del argv
  from sao.aot import tpu_topology  # pylint: disable=g-import-not-at-top
  from sao.train import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from experiments.compile_tpu import code_version  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  version = code_version()
  chip, devices = tpu_topology.topology_devices(_TOPOLOGY.value)
  mesh = mesh_lib.make_mesh(parse_mesh(_MESH.value), devices)
  cfg = model_config(_MODEL.value, _DTYPE.value, _REMAT.value, _OVERRIDES.value)
  print(f"{_MODEL.value} {_BLOCK.value} on {_TOPOLOGY.value}, mesh {dict(mesh.shape)}, {_DTYPE.value}, "
        f"remat {_REMAT.value}", flush=True)
  rows = []
  for length in (int(t) for t in _LENGTHS.value):
    rows.append(compile_block(cfg, _BLOCK.value, mesh, _BATCH.value, length, _TOP.value, chip.hbm_bytes, chip,
                              _HLO_DIR.value))
    print(format_row(rows[-1]), flush=True)
    if _OUT.value:
      with open(_OUT.value, "w") as f:
        json.dump([dict(vars(r), model=_MODEL.value, topology=_TOPOLOGY.value, mesh=dict(mesh.shape),
                        model_override=list(_OVERRIDES.value), code_version=version)
                   for r in rows], f, indent=1)
  print(f"compiled {len(rows)} programs in {time.perf_counter() - start:.0f} s")
  if not all(r.fits for r in rows):
    sys.exit(1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
