r"""Benchmark: peak host memory of loading an HF checkpoint, `hf.load_pretrained` (host numpy) vs the streaming
`streaming.load_pretrained_sharded` (one tensor at a time into device arrays).

    python experiments/bench/bench_load.py                                  # a random ~330 MB float32 qwen3 checkpoint
    python experiments/bench/bench_load.py --layers=2 --vocab=8192          # smaller

Writes a random qwen3-style checkpoint with the project's exporter (`hf.save_pretrained`, sharded into ~100 MB
files with an index), then loads it each way in a fresh subprocess and reads that process's peak resident set size
(`VmHWM` of /proc/self/status; reset just before the load through /proc/self/clear_refs where the kernel allows,
else the growth over the pre-load RSS), after a warm-up transfer so that the runtime's own first allocations are not
charged to either loader. Prints one table: peak RSS growth during the load, the loaded params'
bytes, and the peak *overhead* = growth − params bytes. On CPU the "device" arrays are themselves host memory, so
the overhead is what the loader holds besides the model it returns (on an accelerator the params live in HBM and the
whole growth is overhead). All numbers come from this one run.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags
import numpy as np

# the repository, two folders up: this checkout's `sao`
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import: tests import every command in one process, and
  commands share flag names, e.g. `--config`, `--out`, `--batch`)."""
  global _LAYERS, _HIDDEN, _VOCAB, _SHARD_MB, _CHILD, _DIR  # pylint: disable=global-statement
  _LAYERS = flags.DEFINE_integer("layers", 4, "Decoder layers of the random model.")
  _HIDDEN = flags.DEFINE_integer("hidden", 1024, "Hidden size.")
  _VOCAB = flags.DEFINE_integer("vocab", 16384, "Vocabulary size.")
  _SHARD_MB = flags.DEFINE_integer("shard_mb", 100, "Safetensors shard size of the written checkpoint (MB).")
  _CHILD = flags.DEFINE_enum("child", "", ["", "old", "new"], "Internal: load --dir one way and print JSON.")
  _DIR = flags.DEFINE_string("dir", "", "Internal: the checkpoint directory a child loads.")


def _status(key: str) -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(key + ":"):
        return int(line.split()[1]) * 1024
  raise RuntimeError(f"/proc/self/status has no {key}")


def _child(kind: str, directory: str) -> None:
  import jax  # the subprocess pays jax's import before the baseline is read
  from sao.models import hf, streaming
  # Warm the runtime up: its first transfers allocate ~30 MB that neither loader should be charged for.
  small = jax.make_array_from_callback((4,), jax.sharding.SingleDeviceSharding(jax.devices()[0]),
                                       lambda i: np.ones(4)[i])
  jax.block_until_ready([small, jax.numpy.asarray(np.ones(4)) + 1])
  try:  # "5" resets the peak RSS (VmHWM) to the current RSS (Linux ≥ 4.0)
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
  except OSError:
    pass
  before = _status("VmRSS")
  start = time.perf_counter()
  if kind == "old":
    _, params = hf.load_pretrained(directory)
  else:
    _, params = streaming.load_pretrained_sharded(directory)
  jax.block_until_ready(params)
  seconds = time.perf_counter() - start
  param_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  print(json.dumps({"peak_growth": _status("VmHWM") - before, "param_bytes": param_bytes, "seconds": seconds}))


def _write_checkpoint(directory: str) -> int:
  import jax
  from sao.models import hf
  from sao.models.config import ModelConfig
  from sao.models.transformer import abstract_params
  import flax.linen as nn
  config = ModelConfig.tiny("qwen3", vocab_size=_VOCAB.value, hidden_size=_HIDDEN.value,
                            intermediate_size=3 * _HIDDEN.value, num_layers=_LAYERS.value, num_heads=16,
                            num_kv_heads=8, head_dim=_HIDDEN.value // 16)
  rng = np.random.default_rng(0)
  shapes = nn.meta.unbox(abstract_params(config))
  params = jax.tree.map(lambda s: (0.02 * rng.standard_normal(s.shape, np.float32)), shapes)
  hf.save_pretrained(config, params, directory, max_shard_bytes=_SHARD_MB.value * 1024 ** 2)
  return sum(x.nbytes for x in jax.tree.leaves(params))


def main(argv):
  del argv
  if _CHILD.value:
    _child(_CHILD.value, _DIR.value)
    return
  with tempfile.TemporaryDirectory() as tmp:
    size = _write_checkpoint(tmp)
    files = sorted(f for f in os.listdir(tmp) if f.endswith(".safetensors"))
    print(f"checkpoint: {size / 2**20:.0f} MiB float32 qwen3 in {len(files)} safetensors files")
    print(f"{'loader':<34} {'peak RSS growth':>16} {'params':>10} {'overhead':>10} {'overhead/ckpt':>14} {'s':>6}")
    for kind, label in (("old", "hf.load_pretrained"), ("new", "streaming.load_pretrained_sharded")):
      out = subprocess.run([sys.executable, __file__, f"--child={kind}", f"--dir={tmp}"], check=True,
                           capture_output=True, text=True).stdout
      r = json.loads(out.strip().splitlines()[-1])
      overhead = r["peak_growth"] - r["param_bytes"]
      print(f"{label:<34} {r['peak_growth'] / 2**20:>12.0f} MiB {r['param_bytes'] / 2**20:>6.0f} MiB "
            f"{overhead / 2**20:>6.0f} MiB {overhead / size:>14.2f} {r['seconds']:>6.1f}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
