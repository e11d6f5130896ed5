r"""A compile report's model FLOPs and MFU under both attention counts, and the recount of old rows to the project's:

    python experiments/bench/mfu_conventions.py --config=experiments/configs/sao_openswe.py:full_64k \
        --report=docs/reports/sao_full64k_v5p128.json [--programs=actor_step_dis,critic_step] [--rewrite]

The project counts attention causal, as MaxText does (`compile_stats.analytic_flops`: half of full attention's
`Q·Kᵀ` and `P·V`, what a causal kernel computes); rows compiled before 2026-12-06 hold PaLM's full-attention count
(their `model_flops_convention` is missing or "full_attention"). For each priced model program this prints its model
TFLOPs both ways and its per-instruction MFU both ways (MFU_causal = MFU_full · causal / full, with
full = causal + `compile_stats.full_attention_flops` / 2). `--rewrite` recounts every full-attention row of the file
to the causal count in place (`analytic_flops`, `estimated_mfu`, `instruction_mfu`, `model_flops_convention`;
atomically; the rows keep their commits: the programs are the same, only the count of their work changes). The config
must be the report's (its model's attention layers, heads and head width); a row compiled with fewer layers
(`compile_tpu.py --num_layers`) is counted with that many.
"""
from __future__ import annotations

import json
import os
import sys

from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

CAUSAL, FULL = "causal_attention", "full_attention"


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import)."""
  global _CONFIG, _REPORT, _PROGRAMS, _REWRITE  # pylint: disable=global-statement
  _CONFIG = config_flags.DEFINE_config_file("config", None, "The report's experiment config (get_config(arg)).")
  _REPORT = flags.DEFINE_string("report", None, "The compile report's JSON row file.", required=True)
  _PROGRAMS = flags.DEFINE_list("programs", [], "Only these programs (default: every model program).")
  _REWRITE = flags.DEFINE_bool("rewrite", False, "Recount the file's full-attention rows to the causal count.")


def _attention(record: dict, model_config) -> float:
  """Full attention's FLOPs of the row's program, with the row's depth; ValueError when they cannot be part of its
  model FLOPs (the wrong --config)."""
  from experiments.compile_tpu import truncated  # pylint: disable=g-import-not-at-top
  from sao.aot import compile_stats  # pylint: disable=g-import-not-at-top
  layers = int(record.get("num_layers") or model_config.num_layers)
  model = truncated(model_config, layers) if layers != model_config.num_layers else model_config
  attention = compile_stats.full_attention_flops(model, int(record["batch"]), int(record["bucket"]),
                                                 bool(record["train"]))
  dense = record["analytic_flops"] - (attention / 2 if record.get("model_flops_convention") == CAUSAL else attention)
  if dense <= 0:
    raise ValueError(f"{record['program']} T={record['bucket']}: the config's attention ({attention:.4g} FLOPs) is "
                     f"not part of the row's model FLOPs ({record['analytic_flops']:.4g}): is --config the report's?")
  return attention


def conventions(records: list[dict], model_config, programs=()) -> list[dict]:
  """Per priced model row: program, bucket, its count, the full- and causal-attention model FLOPs and the
  per-instruction MFU both ways."""
  out = []
  for r in sorted(records, key=lambda r: (int(r["bucket"]), r["program"])):
    if not r.get("analytic_flops") or r.get("instruction_mfu") is None or (programs and r["program"] not in programs):
      continue
    attention = _attention(r, model_config)
    causal_row = r.get("model_flops_convention") == CAUSAL
    full = r["analytic_flops"] + (attention / 2 if causal_row else 0.0)
    causal = full - attention / 2
    mfu_full = r["instruction_mfu"] * (full / r["analytic_flops"])
    out.append({"program": r["program"], "bucket": int(r["bucket"]), "convention": CAUSAL if causal_row else FULL,
                "full_flops": full, "causal_flops": causal, "full_mfu": mfu_full,
                "causal_mfu": mfu_full * causal / full})
  return out


def recount(records: list[dict], model_config) -> list[str]:
  """Recounts every full-attention row of `records` to the causal count in place; returns what it changed."""
  changed = []
  for r in records:
    if r.get("model_flops_convention") == CAUSAL:
      continue
    if r.get("analytic_flops"):
      attention = _attention(r, model_config)
      scale = (r["analytic_flops"] - attention / 2) / r["analytic_flops"]
      r["analytic_flops"] -= attention / 2
      for key in ("estimated_mfu", "instruction_mfu"):
        if r.get(key) is not None:
          r[key] *= scale
      changed.append(f"{r['program']} T={r['bucket']}: model FLOPs × {scale:.4f}")
    r["model_flops_convention"] = CAUSAL
  return changed


def main(argv):
  del argv
  from experiments.compile_tpu import model_config_of  # pylint: disable=g-import-not-at-top
  with open(_REPORT.value) as f:
    records = json.load(f)
  model_config = model_config_of(_CONFIG.value, "bfloat16")
  if _REWRITE.value:
    from sao.aot import report  # pylint: disable=g-import-not-at-top
    changed = recount(records, model_config)
    report.write_json_atomically(_REPORT.value, records)
    print(f"{_REPORT.value}: recounted {len(changed)} rows to causal attention" +
          "".join(f"\n  {line}" for line in changed))
  rows = conventions(records, model_config, tuple(_PROGRAMS.value))
  print(f"{'program':<20}{'T':>8}{'full TF':>12}{'causal TF':>12}{'MFU full':>10}{'MFU causal':>12}  row holds")
  for r in rows:
    print(f"{r['program']:<20}{r['bucket']:>8}{r['full_flops'] / 1e12:>12.4g}{r['causal_flops'] / 1e12:>12.4g}"
          f"{100 * r['full_mfu']:>9.1f}%{100 * r['causal_mfu']:>11.1f}%  {r['convention']}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
