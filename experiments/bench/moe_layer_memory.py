r"""Per-chip memory of ONE routed MoE block's forward + backward, compiled ahead of time for a TPU topology.

`jax.grad` (w.r.t. the block's params and its input) of `sao.models.layers.MoE` at the seed model's sizes (the
`full` configs' Qwen3.5-35B-A3B: hidden 2048, 256 experts, top-8, expert width 512, shared expert; bf16), on the
learner's mesh (data 1 × fsdp 8 × expert 1 × tensor −1), the input `[B, T, hidden]` sharded as the learner shards a
micro-batch (B over the batch rule's axes) and the params by `sao.models.sharding.param_shardings`. `--impl`:
"ragged_dot" (jax.lax.ragged_dot with its own transpose: the weight gradient XLA makes dense over the experts) or
"auto" (`sao.models.grouped_matmul`'s custom VJP). Prints XLA's memory analysis and its largest buffers. Run it
serialized with other TPU compiles (6–8 GB of RAM, minutes of CPU):

  flock /tmp/tpu_compile.lock nice -n 5 python experiments/bench/moe_layer_memory.py --impl=ragged_dot
  flock /tmp/tpu_compile.lock nice -n 5 python experiments/bench/moe_layer_memory.py --impl=auto

`--check_megablox`: instead, compile `jax.grad` of a small grouped matmul with the Pallas megablox kernels for
`--topology` (e.g. v5p:2x2x1), once as a plain GSPMD jit (expected to be refused: Mosaic kernels are not
partitionable) and once inside a shard_map over every mesh axis (rows sharded, weights replicated).
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

# the repository, two folders up: this checkout's `sao`
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

GIB = float(1 << 30)
SEED_MODEL = "Qwen/Qwen3.5-35B-A3B"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--impl", choices=("ragged_dot", "auto", "xla"), default="auto")
  parser.add_argument("--context_mesh", action="store_true",
                      help="trace under jax.set_mesh(mesh), as the learner does (the experts' whole-mesh shard_map)")
  parser.add_argument("--check_megablox", action="store_true")
  parser.add_argument("--topology", default="v5p:4x4x8")
  parser.add_argument("--batch", type=int, default=8, help="rows per micro-batch (the full configs: 8)")
  parser.add_argument("--tokens", type=int, default=32768, help="tokens per row (the bucket)")
  parser.add_argument("--hf_path", default=SEED_MODEL)
  args = parser.parse_args()

  from sao.models import known_configs, moe  # pylint: disable=g-import-not-at-top
  from sao.models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  from sao.models.grouped_matmul import grouped_matmul  # pylint: disable=g-import-not-at-top
  from sao.models.layers import MoE  # pylint: disable=g-import-not-at-top
  from sao.models.sharding import param_shardings  # pylint: disable=g-import-not-at-top
  from sao.aot import compile_stats, tpu_topology  # pylint: disable=g-import-not-at-top
  from sao.train import mesh as mesh_lib  # pylint: disable=g-import-not-at-top

  if args.check_megablox:
    check_megablox(args.topology)
    return
  moe.grouped_matmul = functools.partial(grouped_matmul, impl=args.impl)  # the block's grouped matmuls
  cfg = ModelConfig.from_hf(known_configs.hf_config(args.hf_path), dtype="bfloat16", param_dtype="bfloat16")
  chip, devices = tpu_topology.topology_devices(args.topology)
  mesh = mesh_lib.make_mesh(dict(data=1, fsdp=8, expert=1, tensor=-1), devices)
  block = MoE(cfg)
  x_shape = (args.batch, args.tokens, cfg.hidden_size)
  boxed = jax.eval_shape(block.init, jax.random.PRNGKey(0), jax.ShapeDtypeStruct(x_shape, jnp.bfloat16))["params"]
  shardings = param_shardings(boxed, mesh)
  params = jax.tree.map(lambda leaf, s: jax.ShapeDtypeStruct(leaf.value.shape, leaf.value.dtype, sharding=s), boxed,
                        shardings, is_leaf=lambda v: hasattr(v, "names"))
  x_sharding = NamedSharding(mesh, P(mesh_lib.batch_sharding(mesh).spec[0]))
  x = jax.ShapeDtypeStruct(x_shape, jnp.bfloat16, sharding=x_sharding)

  def loss(p, x):
    return jnp.sum(block.apply({"params": p}, x).astype(jnp.float32) ** 2)

  print(f"MoE block of {args.hf_path}: hidden {cfg.hidden_size}, {cfg.num_experts} experts, "
        f"top-{cfg.num_experts_per_tok}, expert width {cfg.moe_intermediate_size}; x {x_shape} sharded "
        f"{x_sharding.spec}, mesh {dict(mesh.shape)}, {args.topology}, grouped matmul impl={args.impl}, "
        f"context mesh {args.context_mesh}", flush=True)
  start = time.perf_counter()
  if args.context_mesh:
    with jax.set_mesh(mesh):
      lowered = jax.jit(jax.grad(loss, argnums=(0, 1))).trace(params, x).lower()
  else:
    lowered = jax.jit(jax.grad(loss, argnums=(0, 1))).trace(params, x).lower()
  with tempfile.TemporaryDirectory(prefix="moe_layer_") as dump_dir:
    try:
      compiled = lowered.compile(compiler_options={"xla_dump_to": dump_dir})
      memory = compiled.memory_analysis()
      print(f"compiled in {time.perf_counter() - start:.0f} s; per chip: arguments "
            f"{memory.argument_size_in_bytes / GIB:.2f} GiB, temporaries {memory.temp_size_in_bytes / GIB:.2f} GiB, "
            f"outputs {memory.output_size_in_bytes / GIB:.2f} GiB (chip {chip.hbm_bytes / GIB:.0f} GiB)")
    except jax.errors.JaxRuntimeError as e:
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      print(f"does not fit ({time.perf_counter() - start:.0f} s): {str(e).splitlines()[0]}")
    report = compile_stats.buffer_report(dump_dir, top=5)
  if report:
    print(f"buffer assignment: temporaries {report.temp_bytes / GIB:.2f} GiB; largest:")
    for b in report.largest:
      print(f"  {b.size / GIB:8.3f} GiB {b.kind:9s} {b.shape:32s} {b.instruction}  {b.op_name[-90:]}")


def check_megablox(topology: str) -> None:
  """Pallas megablox gmm / tgmm (`impl="megablox"`) compiled ahead of time for `topology` from this host."""
  from sao.models.grouped_matmul import grouped_matmul  # pylint: disable=g-import-not-at-top
  from sao.aot import tpu_topology  # pylint: disable=g-import-not-at-top
  _, devices = tpu_topology.topology_devices(topology)
  mesh = jax.sharding.Mesh(devices, ("rows",))
  rows, hidden, width, groups = 1024 * len(devices), 512, 256, 8

  def grad(lhs, rhs, sizes):
    loss = lambda a, b: jnp.sum(grouped_matmul(a, b, sizes, impl="megablox").astype(jnp.float32) ** 2)
    return jax.grad(loss, argnums=(0, 1))(lhs, rhs)

  def per_shard(lhs, rhs, sizes):  # each chip: its rows, all groups' weights; the weight gradient summed
    d_lhs, d_rhs = grad(lhs, rhs, sizes[0])
    return d_lhs, jax.lax.psum(d_rhs, "rows")

  lhs = jax.ShapeDtypeStruct((rows, hidden), jnp.bfloat16, sharding=NamedSharding(mesh, P("rows")))
  rhs = jax.ShapeDtypeStruct((groups, hidden, width), jnp.bfloat16, sharding=NamedSharding(mesh, P()))
  sizes = jax.ShapeDtypeStruct((len(devices), groups), jnp.int32, sharding=NamedSharding(mesh, P("rows")))
  try:
    jax.jit(grad).trace(lhs, rhs, jax.ShapeDtypeStruct((groups,), jnp.int32)).lower().compile()
    print("GSPMD jit: compiled")
  except Exception as e:  # pylint: disable=broad-except  (reported, it is the point of the check)
    print(f"GSPMD jit: refused: {type(e).__name__}: {str(e).splitlines()[0]}")
  start = time.perf_counter()
  mapped = jax.shard_map(per_shard, mesh=mesh, in_specs=(P("rows"), P(), P("rows")), out_specs=(P("rows"), P()),
                         check_vma=False)
  lowered = jax.jit(mapped).trace(lhs, rhs, sizes).lower()
  text = lowered.as_text()
  compiled = lowered.compile()
  memory = compiled.memory_analysis()
  print(f"shard_map over {topology}: {text.count('tpu_custom_call')} Mosaic calls in the lowering, compiled in "
        f"{time.perf_counter() - start:.0f} s; per chip temporaries {memory.temp_size_in_bytes / 2**20:.1f} MiB, "
        f"arguments {memory.argument_size_in_bytes / 2**20:.1f} MiB")


if __name__ == "__main__":
  main()
