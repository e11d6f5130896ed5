r"""Adds the per-instruction serial sum (`sao.aot.instruction_time`) to compile-report rows that lack it, from the
HLO their compile saved (`compile_tpu.py --hlo_dir`), without compiling again:

    python experiments/annotate_report.py --report=docs/reports/sao_full_v5p128.json --hlo_dir=<dir> \
        [--moe_capacity_factor=2]

`compile_tpu.py` records the sum on every row it compiles; this is for rows compiled before it did, and (`--reprice`)
for rows priced before a change to the cost model. A row is priced
from `<hlo_dir>/<program>_T<bucket>.hlo.txt.gz` on the chip of its topology, its MoE grouped matmuls by the rows of
the shard's own experts (the row's `expert` mesh axis and `--moe_capacity_factor`, which must be the config's
`model.moe_capacity_factor`; a row compiled with expert parallelism needs it). The file is rewritten once, atomically;
each row keeps its commit (the HLO is that commit's program), and rows already priced, or with no HLO file, are left
as they are and listed.
"""
from __future__ import annotations

import gzip
import json
import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import)."""
  global _REPORT, _HLO_DIR, _CAPACITY, _REPRICE  # pylint: disable=global-statement
  _REPORT = flags.DEFINE_string("report", None, "The compile report's JSON row file (rewritten in place).",
                                required=True)
  _HLO_DIR = flags.DEFINE_string("hlo_dir", None, "Where the rows' compile wrote <program>_T<bucket>.hlo.txt.gz.",
                                 required=True)
  _CAPACITY = flags.DEFINE_float("moe_capacity_factor", None, "The config's model.moe_capacity_factor (needed for "
                                 "rows compiled with an expert mesh axis > 1).")
  _REPRICE = flags.DEFINE_bool("reprice", False, "Price rows that already have a per-instruction sum again (after a "
                               "change to the cost model: the rows keep their commits, the HLO is theirs).")


def expert_shards(record: dict) -> int:
  """The row's `expert` mesh axis, a -1 resolved from the chips and the other axes."""
  mesh = {k: int(v) for k, v in (record.get("mesh") or {}).items()}
  expert = mesh.get("expert", 1)
  if expert == -1:
    others = 1
    for name, size in mesh.items():
      others *= size if name != "expert" else 1
    expert = int(record["chips"]) // others
  return expert


def annotate(records: list[dict], hlo_dir: str, capacity_factor: float | None,
             reprice: bool = False) -> tuple[list[str], list[str]]:
  """Prices every unpriced (with `reprice`: every) compiled row of `records` in place; returns (priced, left as they
  were) descriptions."""
  from sao.aot import driver, instruction_time, report, tpu_topology  # pylint: disable=g-import-not-at-top
  priced, skipped = [], []
  for record in records:
    where = f"{record['program']} T={record['bucket']}"
    if record.get("instruction_seconds") is not None and not reprice:
      skipped.append(f"{where} (already priced)")
      continue
    if record.get("status", "compiled") != "compiled":
      skipped.append(f"{where} ({record.get('status')}: no program)")
      continue
    path = driver.hlo_path(hlo_dir, record["program"], int(record["bucket"]))
    if not os.path.exists(path):
      skipped.append(f"{where} (no {path})")
      continue
    shards = expert_shards(record)
    if shards > 1 and capacity_factor is None:
      raise app.UsageError(f"{where} was compiled with expert = {shards}: give --moe_capacity_factor (the config's "
                           "model.moe_capacity_factor)")
    share, _ = instruction_time.grouped_row_share(shards, capacity_factor or 0.0)
    chip = tpu_topology.parse_topology(record["topology"])[0]
    row = report.row_from_dict(record)
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
      text = f.read()
    driver.price_instructions(row, text, chip, int(record["chips"]), share)
    for key in ("instruction_seconds", "instruction_mfu", "grouped_row_share", "instruction_error"):
      record[key] = getattr(row, key)
    priced.append(f"{where}: " + (f"{row.instruction_seconds:.4g} s" if row.instruction_seconds is not None
                                  else f"not priced ({row.instruction_error})"))
  return priced, skipped


def main(argv):
  del argv
  from sao.aot import report  # pylint: disable=g-import-not-at-top
  with open(_REPORT.value) as f:
    records = json.load(f)
  if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
    raise app.UsageError(f"{_REPORT.value}: not a JSON list of report rows")
  priced, skipped = annotate(records, _HLO_DIR.value, _CAPACITY.value, _REPRICE.value)
  if priced:
    report.write_json_atomically(_REPORT.value, records)
  print("\n".join([f"priced {len(priced)} rows of {_REPORT.value}:", *(f"  {p}" for p in priced),
                   f"left {len(skipped)} rows as they were:", *(f"  {s}" for s in skipped)]))


if __name__ == "__main__":
  define_flags()
  app.run(main)
