r"""Compiles one training step of an experiment config for a TPU topology, on any machine (libtpu, no TPU), and
reports per program and bucket length the HBM per chip, the FLOPs and XLA's cost-model time.

    python experiments/compile_tpu.py --config=experiments/configs/sao_openswe.py:full --topology=v5p:4x4x8 \
        --out=/tmp/sao_full_v5p128.json

The programs are the trainer's own (`sao.aot.driver`: an abstract `Learner` on the topology's mesh runs its update
code with every jitted program recorded, then each is lowered and compiled). No weights are read: a `full` config's
`model.hf_path` needs only its `config.json` (a local directory, or a hub id `sao.models.known_configs` knows).
The model is built as the trainer loads it: the config's `model.param_dtype`, `model.compute_dtype` and `model.remat`
(`--model_dtype` overrides both dtypes).

Columns: HBM per chip in GiB (arguments, temporaries, new outputs, total) against the chip's capacity; TFLOPs of
the whole step over all chips: `xla` is XLA's `cost_analysis()` (it counts each loop body once), `program` the
matmul FLOPs of the program with loops multiplied out, `model` the analytic count (6·N_active·tokens for a train
step, 2·N_active·tokens for a forward, plus attention); `est s` and `MFU` are XLA's cost-model estimate (scaled
by the loop trip counts XLA leaves out) — an estimate, not a measurement. Exits 1 when a program does not fit or
its compile failed, naming it.

`--out` writes the rows as JSON, each as soon as it is compiled (`sao.aot.report`); `--resume` keeps the rows
already in that file (refusing a file compiled for other settings) and compiles only the missing ones, largest bucket
first; a failed row counts as done unless `--retry_failed`. The table at the end covers every row of the file.
"""
from __future__ import annotations

import os
import sys
import time

from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # `experiments.configs` imports


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import: a module may be imported beside other commands
  whose flags share names)."""
  global _CONFIG, _TOPOLOGY, _OUT, _BUCKETS, _PROGRAMS, _MODEL_DTYPE, _NUM_LAYERS  # pylint: disable=global-statement
  global _RESUME, _RETRY_FAILED, _ALLOW_CODE_CHANGE, _HLO_DIR  # pylint: disable=global-statement
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (get_config(arg)).",
                                            lock_config=True)
  _TOPOLOGY = flags.DEFINE_string("topology", None, "TPU topology, <chip>:<shape>: v5p:4x4x8, v6e:16x16, v4:4x4x4 …")
  _OUT = flags.DEFINE_string("out", "", "Write the report rows here as JSON, each as soon as it is compiled (without "
                             "--resume an existing file is replaced).")
  _RESUME = flags.DEFINE_bool("resume", False, "Keep the rows already in --out and compile only the missing ones; "
                              "refused when the file was compiled for another topology, config, overrides, dtype, "
                              "layer count or code version.")
  _RETRY_FAILED = flags.DEFINE_bool("retry_failed", False,
                                    "With --resume: compile the rows whose compile failed again.")
  _ALLOW_CODE_CHANGE = flags.DEFINE_bool("allow_code_change", False, "With --resume: keep rows compiled by another "
                                         "git commit / jax / libtpu (each row records its own).")
  _HLO_DIR = flags.DEFINE_string("hlo_dir", "", "Also write each compiled program's HLO text here "
                                  "(<program>_T<bucket>.hlo.txt.gz), for reading what XLA's estimate spends its time "
                                  "on without compiling again: experiments/bench/hlo_breakdown.py --hlo=<file>.")
  _BUCKETS = flags.DEFINE_list("buckets", [], "Bucket lengths to compile (default: the config's).")
  _PROGRAMS = flags.DEFINE_list("programs", [], "Programs to compile (default: every program of the update).")
  _MODEL_DTYPE = flags.DEFINE_enum("model_dtype", "", ["", "float32", "bfloat16"],
                                   "Param and compute dtype of the model; '' = the config's model.param_dtype / "
                                   "model.compute_dtype.")
  _NUM_LAYERS = flags.DEFINE_integer(
      "num_layers", 0, "Compile the model truncated to its first N decoder layers (0 = all). Compile time and memory "
      "grow with the layers; compiling two depths and fitting `a + b·layers` per column estimates the full model on a "
      "machine too small to compile it (the report says so on every row).")
  flags.mark_flags_as_required(["config", "topology"])


GIB = float(1 << 30)


def model_config_of(config, dtype: str = ""):
  """The policy architecture the trainer would build for `config.model` (without reading weights), with the
  config's precision and remat (`dtype`, when given, sets both param and compute dtype)."""
  from sao.models import known_configs  # pylint: disable=g-import-not-at-top
  from sao.models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  from sao.models.tokenizer import toy_tokenizer  # pylint: disable=g-import-not-at-top
  m = config.model
  precision = dict(dtype=dtype or m.compute_dtype, param_dtype=dtype or m.param_dtype, remat=m.remat,
                   scan_layers=m.get("scan_layers", False), moe_capacity_factor=m.get("moe_capacity_factor", 0.0),
                   linear_attn_matmul=m.get("linear_attn_matmul", "float32"),
                   sequence_parallel=m.get("sequence_parallel", False))
  if m.init == "hf":
    return ModelConfig.from_hf(known_configs.hf_config(m.hf_path), **precision)
  toy = {k: v for k, v in m.toy.items() if k != "model_type"}
  return ModelConfig.tiny(m.toy.model_type, vocab_size=toy_tokenizer().vocab_size, **{**precision, **toy})


def truncated(model_config, num_layers: int):
  """`model_config` with only its first `num_layers` decoder layers (the same block types, in order)."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  if not 0 < num_layers <= model_config.num_layers:
    raise ValueError(f"num_layers: {num_layers} is not in [1, {model_config.num_layers}]")
  return dataclasses.replace(model_config, num_layers=num_layers, layer_types=model_config.layer_types[:num_layers])


def config_overrides(argv) -> str:
  """The config's overrides on the command line: the argument after `:` of --config, then every --config.<key>=…
  (sorted: their order does not matter)."""
  argument = [arg.partition(":")[2] for arg in argv[1:] if arg.startswith("--config=")]
  keys = sorted(arg[len("--"):] for arg in argv[1:] if arg.startswith("--config."))
  return " ".join(p for p in argument + keys if p)


def code_version() -> str:
  """`launch.sweep.code_version` of this checkout (commit, `+dirty.<hash>` with uncommitted changes), or "unknown"
  without git."""
  from launch import sweep  # pylint: disable=g-import-not-at-top
  try:
    return sweep.code_version()
  except RuntimeError as e:
    print(f"compile_tpu: no git commit for the rows ({e}); code_version = unknown", file=sys.stderr)
    return "unknown"


def run_settings(config, model_config, topology: str, chips: int, chip) -> dict:
  """What each row records about how it was compiled (`report.SETTINGS_KEYS`, `CODE_KEYS` and the command)."""
  import hashlib  # pylint: disable=g-import-not-at-top
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  try:
    libtpu_version = importlib.metadata.version("libtpu")
  except importlib.metadata.PackageNotFoundError:
    libtpu_version = "none"
  return {"topology": topology, "config": config.name, "config_overrides": config_overrides(sys.argv),
          "config_sha256": hashlib.sha256(config.to_json_best_effort(sort_keys=True).encode()).hexdigest(),
          "command": " ".join(sys.argv), "chips": chips, "peak_bf16_flops_per_chip": chip.peak_bf16_flops,
          "model_dtype": model_config.dtype, "param_dtype": model_config.param_dtype, "remat": model_config.remat,
          "scan_layers": model_config.scan_layers, "linear_attn_matmul": model_config.linear_attn_matmul,
          "master_weights": bool(config.learner.actor.optimizer.master_weights), "mesh": dict(config.learner.mesh),
          "num_layers": model_config.num_layers, "code_version": code_version(), "jax_version": jax.__version__,
          "libtpu_version": libtpu_version}


def main(argv):
  del argv
  from sao.aot import report, report_table, tpu_topology  # pylint: disable=g-import-not-at-top
  if (_RESUME.value or _RETRY_FAILED.value or _ALLOW_CODE_CHANGE.value) and not _OUT.value:
    raise app.UsageError("--resume, --retry_failed and --allow_code_change need --out")
  if (_RETRY_FAILED.value or _ALLOW_CODE_CHANGE.value) and not _RESUME.value:
    raise app.UsageError("--retry_failed and --allow_code_change only apply with --resume")
  config = _CONFIG.value
  start = time.perf_counter()
  chip, devices = tpu_topology.topology_devices(_TOPOLOGY.value)
  model_config = model_config_of(config, _MODEL_DTYPE.value)
  if _NUM_LAYERS.value:
    model_config = truncated(model_config, _NUM_LAYERS.value)
  print(f"{config.name}: {config.learner.algorithm}, {model_config.model_type} (params {model_config.param_dtype}, "
        f"compute {model_config.dtype}, remat {model_config.remat}, scan_layers {model_config.scan_layers}, "
        f"master weights "
        f"{config.learner.actor.optimizer.master_weights}, {model_config.num_layers} layers), "
        f"{_TOPOLOGY.value} = {len(devices)} chips, mesh {dict(config.learner.mesh)}, "
        f"micro_batch_size {config.learner.batching.micro_batch_size}"
        + (f" ({config.learner.batching.micro_batch_by_length} by length)"
           if config.learner.batching.get("micro_batch_by_length") else ""), flush=True)
  settings = run_settings(config, model_config, _TOPOLOGY.value, len(devices), chip)
  try:
    row_file = report.RowFile(_OUT.value, settings, _RESUME.value, _ALLOW_CODE_CHANGE.value) if _OUT.value \
        else None
  except (OSError, ValueError) as e:  # a file of other settings, not a report, or a path that cannot be written
    print(f"compile_tpu: {e}", file=sys.stderr)
    sys.exit(2)
  done = row_file.done(_RETRY_FAILED.value) if row_file else set()
  if row_file and row_file.rows:
    print(f"resuming {_OUT.value}: {len(row_file.rows)} rows already there, {len(done)} of them skipped", flush=True)
  new_rows = []

  def on_row(row):  # each row as soon as it is compiled (a full config takes many minutes per program)
    new_rows.append(row)
    print(f"  [{row.compile_seconds:.0f} s, peak RSS {row.peak_rss_bytes / GIB:.1f} GiB ({row.peak_rss_scope}), "
          f"{time.perf_counter() - start:.0f} s elapsed] {report_table.row_line(row, chip)}", flush=True)
    if row_file:
      row_file.put(row)

  buckets = [int(b) for b in _BUCKETS.value] or [int(b) for b in config.learner.batching.bucket_lengths]
  try:
    report.compile_missing(config, model_config, devices, chip, buckets, _PROGRAMS.value, done, on_row,
                               log=lambda message: print(message, flush=True), hlo_dir=_HLO_DIR.value)
  except ValueError as e:  # a config the learner rejects on this topology: say so, as the trainer would
    print(f"compile_tpu: {config.name} on {_TOPOLOGY.value}: {e}", file=sys.stderr)
    sys.exit(2)
  rows = row_file.report_rows() if row_file else sorted(new_rows, key=lambda r: r.bucket)
  print(report_table.format_table(rows, chip))
  print("\n".join(report_table.update_summary(rows, chip, len(devices))))
  print(f"compiled {len(new_rows)} programs in {time.perf_counter() - start:.0f} s"
        + (f"; {len(rows) - len(new_rows)} rows resumed from {_OUT.value}" if row_file and _RESUME.value else ""))
  bad = [f"{r.program} (T={r.bucket})" for r in rows if not r.fits and r.status != "failed"]
  failed = [f"{r.program} (T={r.bucket})" for r in rows if r.status == "failed"]
  if bad:
    print(f"does not fit on {_TOPOLOGY.value}: {', '.join(bad)}", file=sys.stderr)
  if failed:
    print(f"compile failed on {_TOPOLOGY.value}: {', '.join(failed)}", file=sys.stderr)
  if bad or failed:
    sys.exit(1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
