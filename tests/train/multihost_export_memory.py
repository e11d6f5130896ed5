"""Measures peak host memory of `sao.train.export.export_policy` against the model's size (docs/tpu.md, "Multi-host
weight export"). Not a test: run it by hand.

    PYTHONPATH=$PWD python tests/train/multihost_export_memory.py --processes 2 --out /tmp/export_memory

starts the job (P CPU processes × `--devices_per_process` devices, mesh fsdp = all devices: every param split over the
processes; a qwen3 of `--layers` layers, hidden 1024, vocab 32000), each process initialises the params straight into
their shardings, samples its resident set size (VmRSS) every 2 ms while exporting, and prints the rise above the RSS
just before the export. On CPU, device buffers are host memory too: the param being gathered, replicated on each of
the process's devices, counts in the RSS (on a TPU it is in HBM). `--baseline` also measures, in process 0 of a
1-process job, the old path (`jax.device_get` of the whole tree + `sao.models.hf.save_pretrained`).
"""
import argparse
import ctypes
import functools
import os
import shutil
import threading
import time

from tests import multihost


def _rss_bytes() -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) * 1024
  raise RuntimeError("no VmRSS in /proc/self/status")


class _PeakRss:
  """Samples VmRSS in a thread; `rise` is the peak above the RSS at start."""

  def __enter__(self):
    # Hand freed heap pages back first: otherwise an earlier peak (the init) hides what the export allocates.
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    self.start = _rss_bytes()
    self.peak = self.start
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._sample, daemon=True)
    self._thread.start()
    return self

  def _sample(self):
    while not self._stop.is_set():
      self.peak = max(self.peak, _rss_bytes())
      time.sleep(0.002)

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()
    self.peak = max(self.peak, _rss_bytes())

  @property
  def rise(self) -> int:
    return self.peak - self.start


def worker(out: str, baseline: bool, layers: int) -> None:
  process = multihost.initialize_from_env()
  import jax

  from sao.models import hf
  from sao.models.config import ModelConfig
  from sao.models.transformer import abstract_params, init_params
  from sao.train import mesh as mesh_lib
  from sao.train.export import export_policy

  config = ModelConfig.tiny("qwen3", vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_heads=16,
                            num_kv_heads=8, head_dim=64, num_layers=layers)
  mesh = mesh_lib.make_mesh({"fsdp": jax.device_count()})
  shardings = mesh_lib.param_shardings(abstract_params(config), mesh)
  params = jax.jit(functools.partial(init_params, config), out_shardings=shardings)(jax.random.PRNGKey(0))
  jax.block_until_ready(params)
  model_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  largest = max(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  directory = os.path.join(out, f"policy{jax.process_count()}")
  start = time.monotonic()
  with _PeakRss() as rss:
    export_policy(config, params, None, directory)
  seconds = time.monotonic() - start
  mb = 1024 ** 2
  print(f"process {process}/{jax.process_count()}: model {model_bytes / mb:.0f} MiB (largest tensor "
        f"{largest / mb:.0f} MiB); export peak RSS rise {rss.rise / mb:.0f} MiB "
        f"({rss.rise / model_bytes:.2f}× the model) in {seconds:.1f} s", flush=True)
  if baseline and jax.process_count() == 1:
    old = os.path.join(out, "old")
    with _PeakRss() as rss:
      hf.save_pretrained(config, jax.device_get(params), old)
    print(f"old path (device_get + save_pretrained): peak RSS rise {rss.rise / mb:.0f} MiB "
          f"({rss.rise / model_bytes:.2f}× the model)", flush=True)
    shutil.rmtree(old)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--processes", type=int, default=2)
  parser.add_argument("--out", required=True)
  parser.add_argument("--baseline", action="store_true")
  parser.add_argument("--layers", type=int, default=8)
  parser.add_argument("--devices_per_process", type=int, default=4)
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    worker(args.out, args.baseline, args.layers)
    return
  os.makedirs(args.out, exist_ok=True)
  results = multihost.run_processes(__file__, num_processes=args.processes,
                                    devices_per_process=args.devices_per_process,
                                    args=["--worker", "--out", args.out, "--layers", str(args.layers)]
                                    + (["--baseline"] if args.baseline else []),
                                    timeout_s=1800)
  for r in results:
    print("\n".join(line for line in r.output.splitlines() if "RSS" in line))


if __name__ == "__main__":
  main()
