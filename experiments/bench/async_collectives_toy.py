r"""What XLA's async collective flags do to a small sharded program, read by `sao.aot.hlo_overlap`: a scanned MLP
(8 layers, weights sharded over `fsdp` × `tensor` on v5p:2x2x1) whose `value_and_grad` is compiled for the TPU
topology on this host, once as libtpu compiles it by default and once with `--async_collective_fusion`, which sets
`ASYNC_COLLECTIVE_FLAGS` in `LIBTPU_INIT_ARGS` before libtpu starts (MaxText's groups of continuation-fusion flags
for all-gather and all-reduce). Prints the collective opcodes of the optimized HLO and its serial and
schedule-aware times (a cost model, not a measurement).

    python experiments/bench/async_collectives_toy.py
    python experiments/bench/async_collectives_toy.py --async_collective_fusion
"""
from __future__ import annotations

import collections
import os
import re
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

ASYNC_COLLECTIVE_FLAGS = ("--xla_tpu_enable_async_collective_fusion=true",
                          "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
                          "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
                          "--xla_tpu_overlap_compute_collective_tc=true", "--xla_enable_async_all_gather=true",
                          "--xla_tpu_enable_async_collective_fusion_fuse_all_reduce=true",
                          "--xla_enable_async_all_reduce=true")


def define_flags() -> None:
  global _ASYNC, _HLO_OUT  # pylint: disable=global-statement
  _ASYNC = flags.DEFINE_bool("async_collective_fusion", False, "Compile with ASYNC_COLLECTIVE_FLAGS.")
  _HLO_OUT = flags.DEFINE_string("hlo_out", "", "Where to write the optimized HLO text (nowhere: '').")


def compile_toy(layers: int = 8, batch: int = 8, length: int = 1024, width: int = 1024, hidden: int = 4096) -> str:
  """The optimized HLO text of the toy's `value_and_grad` on v5p:2x2x1 (fsdp 2 × tensor 2)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from sao.aot import tpu_topology  # pylint: disable=g-import-not-at-top
  _, devices = tpu_topology.topology_devices("v5p:2x2x1")
  mesh = Mesh(np.array(devices).reshape(2, 2), ("fsdp", "tensor"))
  shard = lambda *spec: NamedSharding(mesh, P(*spec))

  def loss(params, x):
    def layer(h, w):
      up = jax.nn.gelu(jnp.einsum("btd,df->btf", h, w[0]))
      up = jax.lax.with_sharding_constraint(up, shard("fsdp", None, "tensor"))
      return jax.lax.with_sharding_constraint(h + jnp.einsum("btf,fd->btd", up, w[1]), shard("fsdp", None, None)), None
    h, _ = jax.lax.scan(jax.checkpoint(layer), x, params)
    return jnp.mean(h.astype(jnp.float32) ** 2)

  params = (jax.ShapeDtypeStruct((layers, width, hidden), jnp.bfloat16, sharding=shard(None, "fsdp", "tensor")),
            jax.ShapeDtypeStruct((layers, hidden, width), jnp.bfloat16, sharding=shard(None, "tensor", "fsdp")))
  x = jax.ShapeDtypeStruct((batch, length, width), jnp.bfloat16, sharding=shard("fsdp", None, None))
  return jax.jit(jax.value_and_grad(loss)).lower(params, x).compile().as_text()


def main(argv):
  del argv
  if _ASYNC.value:  # read once, when libtpu starts: before the first compile
    os.environ["LIBTPU_INIT_ARGS"] = " ".join(filter(None, [os.environ.get("LIBTPU_INIT_ARGS", ""),
                                                            *ASYNC_COLLECTIVE_FLAGS]))
  from sao.aot import hlo_overlap, hlo_text, tpu_topology  # pylint: disable=g-import-not-at-top
  text = compile_toy()
  if _HLO_OUT.value:
    with open(_HLO_OUT.value, "w") as f:
      f.write(text)
  opcodes = collections.Counter(re.findall(r" ([a-z][a-z-]*)\(%", text))
  targets = collections.Counter(re.findall(r'custom_call_target="(AsyncCollective\w+)"', text))
  print("collective opcodes:", {k: v for k, v in sorted(opcodes.items()) if re.search(r"all-|collective|scatter", k)},
        "async collective fusions:", dict(targets))
  result = hlo_overlap.overlap(hlo_text.parse_module(text), tpu_topology.chip_named("v5p"))
  us = lambda d: {k: round(v * 1e6, 1) for k, v in d.items()}
  print(f"serial {result.serial * 1e6:.1f} µs, schedule-aware {result.overlapped * 1e6:.1f} µs; hidden "
        f"{us(result.hidden)}, async {us(result.async_seconds)}, synchronous {us(result.sync_seconds)}, "
        f"async collectives executed {result.async_pairs:.0f} (per chip, v5p prices; a cost model)")


if __name__ == "__main__":
  define_flags()
  app.run(main)
