r"""The HLO cost model (`sao.aot.hlo_cost`) against a measurement: every program of one SAO update, compiled for the
machine this runs on, priced from its optimized HLO and then timed there.

    python experiments/bench/cost_model_check.py --hidden=256 --layers=4 --seq_len=512 --batch=8 --out=/tmp/c.jsonl
    python experiments/bench/cost_model_check.py --chip=h200 ...   # price with the H200's data-sheet numbers

The learner is `bench_train.py`'s (a dense qwen3, synthetic trajectories, one device, `critic_warmup_steps=0`). One
update runs with every learner program's first call captured (`MeshJit`); each captured program is then compiled
from the same arguments, its HLO priced instruction by instruction (`hlo_cost.breakdown`: loops multiplied out,
`max(FLOPs / peak, bytes / bandwidth)` per instruction, summed serially — the conservative estimate the TPU report
uses — and the perfectly overlapped roofline beside it), and run `--repeats` times (median wall time, the donated
state copied outside the timing).

The prices: `--chip=measured` (default) uses a peak and an HBM bandwidth measured in this process — the best of
`[n, n] @ [n, n]` matmuls in the programs' compute dtype, and of an elementwise pass over a 256 MiB array (bytes
read + written) — so the check tests the cost model's accounting, not a data sheet; `--chip=<name>`
(`tpu_topology.chip_named`: h200, h100, v5p, …) prices with that chip's published peak and bandwidth. Each row
prints and writes (JSON lines) predicted serial seconds, the roofline bound, the measured median and
`measured / predicted`; the last row sums the update (each program × its calls). A factor near 1 means the serial
sum predicts the machine; below 1, the machine overlaps work the sum adds up; far above 1, the model misses costs
(launch overheads, unfused work, kernels slower than the roofline).
"""
from __future__ import annotations

import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.bench import synthetic  # noqa: E402
from experiments.bench.profile_train import best_seconds  # noqa: E402
from sao.aot import hlo_cost, hlo_text, tpu_topology  # noqa: E402
from sao.models.config import ModelConfig  # noqa: E402
from sao.models.transformer import init_params  # noqa: E402
from sao.train import config as config_lib  # noqa: E402
from sao.train import mesh_jit  # noqa: E402
from sao.train.learner import Learner  # noqa: E402
from sao.train.mesh import make_mesh  # noqa: E402


def define_flags() -> None:
  global _HIDDEN, _LAYERS, _SEQ_LEN, _BATCH, _VOCAB, _DTYPE, _CHIP, _REPEATS, _MATMUL, _OUT  # pylint: disable=global-statement
  _HIDDEN = flags.DEFINE_integer("hidden", 256, "Model width (heads of 64).")
  _LAYERS = flags.DEFINE_integer("layers", 4, "Decoder layers.")
  _SEQ_LEN = flags.DEFINE_integer("seq_len", 512, "Tokens per trajectory (the one bucket).")
  _BATCH = flags.DEFINE_integer("batch", 8, "Trajectories per update.")
  _VOCAB = flags.DEFINE_integer("vocab", 4096, "Vocabulary size.")
  _DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype (params stay float32).")
  _CHIP = flags.DEFINE_string("chip", "measured", "Prices: `measured` (this process's matmul peak and bandwidth) "
                              "or a chip name of sao.aot.tpu_topology.chip_named (h200, v5p, …).")
  _REPEATS = flags.DEFINE_integer("repeats", 5, "Timed runs per program (the median is kept).")
  _MATMUL = flags.DEFINE_integer("matmul", 2048, "n of the [n, n] @ [n, n] matmul that measures the peak.")
  _OUT = flags.DEFINE_string("out", "", "Also write the rows here as JSON lines.")


def measured_chip(dtype, n: int) -> tpu_topology.Chip:
  """A `Chip` priced by this process's own best matmul FLOP/s (in `dtype`) and elementwise bandwidth."""
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
  peak = 2.0 * n ** 3 / best_seconds(jax.jit(lambda x, y: x @ y), a, a, repeats=5)
  big = jnp.ones((64 << 20,), jnp.float32)  # 256 MiB: past every cache
  bandwidth = 2.0 * big.nbytes / best_seconds(jax.jit(lambda x: x * 1.0000001), big, repeats=5)
  device = jax.devices()[0]
  return tpu_topology.Chip("measured", device.device_kind, 0, peak, bandwidth, "", 0.0, 0)


class _Capture:
  """The first call of every `MeshJit` during one update: (program, a private copy of its arguments)."""

  def __init__(self):
    self.programs: dict[str, tuple[mesh_jit.MeshJit, tuple]] = {}
    self.calls: dict[str, int] = {}

  def __enter__(self):
    original = self._original = mesh_jit.MeshJit.__call__
    capture = self

    def call(program, *args, **kwargs):
      if kwargs:
        raise ValueError(f"cost_model_check: {program.name} called with keyword arguments")
      capture.calls[program.name] = capture.calls.get(program.name, 0) + 1
      if program.name not in capture.programs:  # copied before the call may donate them
        capture.programs[program.name] = (program, _copy(args))
      return original(program, *args)

    mesh_jit.MeshJit.__call__ = call
    return self

  def __exit__(self, *exc):
    mesh_jit.MeshJit.__call__ = self._original


def _copy(tree):
  return jax.tree.map(lambda x: jnp.array(x, copy=True) if isinstance(x, jax.Array) else x, tree)


def check_program(name: str, program: mesh_jit.MeshJit, args: tuple, chip: tpu_topology.Chip,
                  repeats: int) -> dict:
  """Prices `program` compiled for `args` and times it; the row of the module docstring."""
  t = time.perf_counter()
  compiled = program.lower(*args).compile()
  compile_s = time.perf_counter() - t
  breakdown = hlo_cost.breakdown(hlo_text.parse_module(compiled.as_text()), chip)
  flops = sum(o.count * o.flops for o in breakdown.ops)
  hbm = sum(o.count * o.bytes for o in breakdown.ops if o.kind != "collective")
  times = []  # timed through the jit (its cache holds the same executable; static arguments stay as they were)
  for _ in range(repeats + 1):  # the first run warms up
    fresh = _copy(args)  # the state is donated: each run gets its own copy, made outside the timing
    jax.block_until_ready(fresh)
    t = time.perf_counter()
    jax.block_until_ready(program._traced(program.jitted, *fresh))  # pylint: disable=protected-access
    times.append(time.perf_counter() - t)
  measured = float(np.median(times[1:]))
  predicted = breakdown.total()
  return {"program": name, "predicted_s": predicted, "roofline_s": max(flops / chip.peak_bf16_flops,
                                                                        hbm / chip.hbm_bytes_per_second),
          "measured_s": measured, "factor": measured / predicted if predicted else None,
          "matmul_flops": flops, "hbm_bytes": hbm, "compile_s": compile_s,
          "unknown_custom_calls": breakdown.unknown_custom_calls,
          "unknown_trip_counts": len(breakdown.unknown_trip_counts)}


def main(argv):
  del argv
  hidden = _HIDDEN.value
  dtype = jnp.dtype(_DTYPE.value)
  model_config = ModelConfig.tiny("qwen3", vocab_size=_VOCAB.value, hidden_size=hidden, intermediate_size=3 * hidden,
                                  num_layers=_LAYERS.value, num_heads=max(hidden // 64, 1),
                                  num_kv_heads=max(hidden // 128, 1), head_dim=64, dtype=_DTYPE.value)
  config = config_lib.default_learner_config()
  config.sao.critic_warmup_steps = 0
  config.mesh.update(data=1, fsdp=1, tensor=1)
  config.batching.bucket_lengths = (_SEQ_LEN.value,)
  mesh = make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
  learner = Learner(config, model_config, init_params(model_config, jax.random.PRNGKey(0)), mesh=mesh)
  rng = np.random.default_rng(0)
  trajectories = synthetic.synthetic_trajectories(rng, _BATCH.value, _SEQ_LEN.value, _VOCAB.value)
  with _Capture() as capture:
    learner.update(trajectories)
  chip = measured_chip(dtype, _MATMUL.value) if _CHIP.value == "measured" else tpu_topology.chip_named(_CHIP.value)
  print(f"{jax.devices()[0].device_kind} (jax {jax.__version__}); prices: {chip.name}, "
        f"{chip.peak_bf16_flops / 1e9:,.1f} GFLOP/s peak ({_DTYPE.value} matmul), "
        f"{chip.hbm_bytes_per_second / 1e9:,.1f} GB/s; qwen3 hidden {hidden}, {_LAYERS.value} layers, "
        f"[B, T] = [{_BATCH.value}, {_SEQ_LEN.value}]", flush=True)
  rows = []
  for name, (program, args) in capture.programs.items():
    row = dict(check_program(name, program, args, chip, _REPEATS.value), calls=capture.calls[name])
    rows.append(row)
    print(f"  {name:<22} x{row['calls']}  predicted {row['predicted_s']:.4f} s (roofline {row['roofline_s']:.4f})  "
          f"measured {row['measured_s']:.4f} s  factor {row['factor']:.2f}"
          + (f"  unknown custom calls {row['unknown_custom_calls']}" if row["unknown_custom_calls"] else ""),
          flush=True)
  total = {"program": "update", "calls": 1,
           **{k: sum(r[k] * r["calls"] for r in rows) for k in ("predicted_s", "roofline_s", "measured_s")}}
  total["factor"] = total["measured_s"] / total["predicted_s"]
  rows.append(total)
  print(f"  update: predicted {total['predicted_s']:.4f} s (roofline {total['roofline_s']:.4f}), measured "
        f"{total['measured_s']:.4f} s: measured / predicted = {total['factor']:.2f}; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
  if _OUT.value:
    setting = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "chip": chip.name,
               "peak_flops": chip.peak_bf16_flops, "hbm_bytes_per_second": chip.hbm_bytes_per_second,
               "hidden": hidden, "layers": _LAYERS.value, "seq_len": _SEQ_LEN.value, "batch": _BATCH.value,
               "dtype": _DTYPE.value}
    with open(_OUT.value, "w") as f:
      for row in rows:
        f.write(json.dumps({**setting, **row}) + "\n")


if __name__ == "__main__":
  define_flags()
  app.run(main)
