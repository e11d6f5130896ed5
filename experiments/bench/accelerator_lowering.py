"""Every program of one SAO update, lowered for another platform from this host (not run), and what it holds.

    python experiments/bench/accelerator_lowering.py [--platform=cuda] [--model=dense|moe] [--seq_len=128]

Builds the accelerator check's one-device learner (`accelerator_rows.make_learner`) at toy sizes in bf16 compute,
runs one update on this host while recording every `MeshJit` call (program, abstract arguments with their
shardings), then lowers each distinct program for `--platform` and counts in its StableHLO: cuDNN's fused attention
(`__cudnn$fmhaSoftmax`, forward and backward), XLA's ragged dot (dense over the experts on GPU), Pallas/Triton
custom calls. It also counts the XLA compiles of the update (the first one and a second one, which should compile
nothing). On a host without JAX's CUDA plugin cuDNN cannot be traced (`sao.models.cudnn_attention`), so attention
falls back and the report says so; `--assume_cudnn` stands in for a GPU host's cuDNN version query (JAX's
`check_cudnn_version`, the one host dependency of tracing the kernel) to show what a GPU host would lower.
"""
from __future__ import annotations

import collections
import contextlib
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.bench import accelerator_rows as rows  # noqa: E402

MARKERS = {"cudnn_attention": "__cudnn$fmhaSoftmax(", "cudnn_attention_backward": "__cudnn$fmhaSoftmaxBackward(",
           "ragged_dot": "ragged_dot", "triton": "__gpu$xla.gpu.triton", "tpu_custom_call": "tpu_custom_call"}


@contextlib.contextmanager
def assume_cudnn(version: int = 91000):
  """Within the block JAX's cuDNN version query answers `version` (module docstring); for lowering only: running
  the kernel still needs a GPU."""
  from jax._src.cudnn import fused_attention_stablehlo as fused  # pylint: disable=g-import-not-at-top
  original = fused.check_cudnn_version
  fused.check_cudnn_version = lambda: version
  try:
    yield
  finally:
    fused.check_cudnn_version = original


def record_calls():
  """Wraps `MeshJit.__call__` so that every call appends (program, abstract args, kwargs); returns (calls, undo)."""
  import jax  # pylint: disable=g-import-not-at-top
  from sao.train.mesh_jit import MeshJit  # pylint: disable=g-import-not-at-top
  calls: list[tuple[Any, tuple, dict]] = []
  original = MeshJit.__call__

  def abstract(x):
    if isinstance(x, jax.Array):
      return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return x

  def wrapped(self, *args, **kwargs):
    calls.append((self, jax.tree.map(abstract, args), jax.tree.map(abstract, kwargs)))
    return original(self, *args, **kwargs)

  MeshJit.__call__ = wrapped
  return calls, lambda: setattr(MeshJit, "__call__", original)


def lower_update(model: str = "dense", platform: str = "cuda", seq_len: int = 128, batch: int = 2,
                 cudnn: bool = False) -> dict[str, Any]:
  """{"programs": [{name, lowered, error, counts of MARKERS}], "compiles": {"first": n, "second": n}} (the XLA
  compiles of the first and the second update on this host)."""
  with assume_cudnn() if cudnn else contextlib.nullcontext():
    return _lower_update(model, platform, seq_len, batch, cudnn)


def _lower_update(model: str, platform: str, seq_len: int, batch: int, cudnn: bool) -> dict[str, Any]:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from experiments.bench import accelerator_probe as probe  # pylint: disable=g-import-not-at-top
  geometry = rows.TINY_MOE if model == "moe" else rows.TINY_DENSE
  config = rows.tiny_config("qwen3_moe" if model == "moe" else "qwen3", geometry)
  record = probe.Recorder("", "lowering")
  compiles = probe.CompileLog(record)
  learner, _ = rows.make_learner(config, seq_len, jax.devices()[0])
  rng = np.random.default_rng(0)
  calls, undo = record_calls()
  compiles.take()
  counts = {}
  try:
    for update in ("first", "second"):
      learner.update(rows.synthetic_trajectories(rng, batch, seq_len, config.vocab_size))
      counts[update] = len(compiles.take())
  finally:
    undo()
  seen, programs = set(), []
  for program, args, kwargs in calls:
    key = (program.name, id(program), repr(jax.tree.map(lambda x: (x.shape, x.dtype) if hasattr(x, "shape") else x,
                                                        (args, kwargs))))
    if key in seen:
      continue
    seen.add(key)
    entry: dict[str, Any] = {"name": program.name}
    try:
      text = program.trace(*args, **kwargs).lower(lowering_platforms=(platform,)).as_text()
      entry.update(lowered=True, **{k: text.count(v) for k, v in MARKERS.items()})
    except Exception as e:  # pylint: disable=broad-except  (a program that cannot be lowered is the finding)
      entry.update(lowered=False, error=f"{type(e).__name__}: {str(e)[:300]}")
    programs.append(entry)
  return {"platform": platform, "model": model, "cudnn_assumed": cudnn, "calls": len(calls),
          "programs": programs, "compiles": counts}


def main(argv: list[str]) -> None:
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--platform", default="cuda")
  parser.add_argument("--model", default="dense", choices=("dense", "moe"))
  parser.add_argument("--seq_len", type=int, default=128)
  parser.add_argument("--assume_cudnn", action="store_true")
  args = parser.parse_args(argv)
  report = lower_update(args.model, args.platform, args.seq_len, cudnn=args.assume_cudnn)
  print(f"{report['model']} update lowered for {report['platform']} (cuDNN assumed: {report['cudnn_assumed']}): "
        f"{report['calls']} calls, {len(report['programs'])} distinct programs; XLA compiles: {report['compiles']}")
  totals = collections.Counter()
  for p in report["programs"]:
    shown = {k: p[k] for k in MARKERS if p.get(k)}
    print(f"  {p['name']:<28} {'lowered' if p['lowered'] else 'FAILED ' + p['error']}  {shown or ''}")
    totals.update({k: p.get(k, 0) for k in MARKERS})
  print(f"  total: {dict(totals)}")


if __name__ == "__main__":
  main(sys.argv[1:])
