r"""A compile report's MFU under both attention conventions: PaLM's (full, non-causal attention — the project's
`compile_stats.analytic_flops`, in which issue 44's targets were stated) and MaxText's (causal attention, half of it —
the convention of the MaxText anchors the issue compares with):

    python experiments/bench/mfu_conventions.py --config=experiments/configs/sao_openswe.py:full_64k \
        --report=docs/reports/sao_full64k_v5p128.json [--programs=actor_step_dis,critic_step]

For each priced model program: its model TFLOPs both ways and its per-instruction MFU both ways
(MFU_MaxText = MFU_PaLM · (analytic − full attention / 2) / analytic, `compile_stats.full_attention_flops`). The
config must be the report's (its model's attention layers, heads and head width); the rows give the rest.
"""
from __future__ import annotations

import json
import os
import sys

from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import)."""
  global _CONFIG, _REPORT, _PROGRAMS  # pylint: disable=global-statement
  _CONFIG = config_flags.DEFINE_config_file("config", None, "The report's experiment config (get_config(arg)).")
  _REPORT = flags.DEFINE_string("report", None, "The compile report's JSON row file.", required=True)
  _PROGRAMS = flags.DEFINE_list("programs", [], "Only these programs (default: every model program).")


def conventions(records: list[dict], model_config, programs=()) -> list[dict]:
  """Per priced model row: program, bucket, PaLM and MaxText model FLOPs, and the per-instruction MFU both ways."""
  from sao.aot import compile_stats  # pylint: disable=g-import-not-at-top
  out = []
  for r in sorted(records, key=lambda r: (int(r["bucket"]), r["program"])):
    if not r.get("analytic_flops") or r.get("instruction_mfu") is None or (programs and r["program"] not in programs):
      continue
    attention = compile_stats.full_attention_flops(model_config, int(r["batch"]), int(r["bucket"]), bool(r["train"]))
    if attention >= r["analytic_flops"]:
      raise ValueError(f"{r['program']} T={r['bucket']}: the config's attention ({attention:.4g} FLOPs) is not part "
                       f"of the row's model FLOPs ({r['analytic_flops']:.4g}): is --config the report's?")
    causal = r["analytic_flops"] - attention / 2
    out.append({"program": r["program"], "bucket": int(r["bucket"]), "palm_flops": r["analytic_flops"],
                "maxtext_flops": causal, "palm_mfu": r["instruction_mfu"],
                "maxtext_mfu": r["instruction_mfu"] * causal / r["analytic_flops"]})
  return out


def main(argv):
  del argv
  from experiments.compile_tpu import model_config_of  # pylint: disable=g-import-not-at-top
  with open(_REPORT.value) as f:
    records = json.load(f)
  rows = conventions(records, model_config_of(_CONFIG.value, "bfloat16"), tuple(_PROGRAMS.value))
  print(f"{'program':<20}{'T':>8}{'PaLM TF':>12}{'MaxText TF':>12}{'MFU PaLM':>10}{'MFU MaxText':>13}")
  for r in rows:
    print(f"{r['program']:<20}{r['bucket']:>8}{r['palm_flops'] / 1e12:>12.4g}{r['maxtext_flops'] / 1e12:>12.4g}"
          f"{100 * r['palm_mfu']:>9.1f}%{100 * r['maxtext_mfu']:>12.1f}%")


if __name__ == "__main__":
  define_flags()
  app.run(main)
