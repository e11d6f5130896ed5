r"""Where XLA's kind of estimate of a compiled program spends its time: every executed instruction of the program's
optimized HLO (`compile_tpu.py --hlo_dir` writes it) priced by the chip's roofline, loops multiplied out, by kind,
model part, phase and bound (`sao.aot.hlo_cost`), with the most expensive instructions and their jax op names.
`s at peak` is the time the group's matmul FLOPs would take at the chip's peak: what a perfect kernel would leave.
`time, schedule-aware` is that serial sum less the async collectives' time the compute scheduled between each start
and done hides (`sao.aot.hlo_overlap`), with the collectives' seconds by kind, async and synchronous.

    python experiments/bench/hlo_breakdown.py --hlo=reports/hlo/sao_full_v5p128/actor_step_dis_T32768.hlo.txt.gz \
        --chip=v5p --chips=128 --report=reports/sao_full_v5p128.json --top=30

`--expert_shards=E` prices the MoE's megablox grouped matmuls by the rows of the shard's own experts under balanced
routing (1/E of the rows all-gathered over `expert`, plus one partial row tile per expert: the kernels' grid visits
only those) instead of the kernels' static estimate over every row (E = 1, the upper bound). A program compiled
with `model.moe_capacity_factor` = c > 0 runs its grouped matmuls on chunks of c × the balanced share: give
`--moe_capacity_factor=c` too, and 1/c of a chunk's rows are priced.

All figures are per chip (the HLO is the per-device program) and from a cost model, not a measurement. `--report`
(the compile report's JSON) adds XLA's own figures for the same program and bucket (its FLOPs count, the report's
estimated seconds) and the model FLOPs the MFU is computed from; `--model_flops` gives those directly (the whole
step over all chips, as the report's `model TF` column).
"""
from __future__ import annotations

import json
import os
import re
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import)."""
  global _HLO, _CHIP, _CHIPS, _TOP, _MODEL_FLOPS, _REPORT, _EXPERT_SHARDS, _CAPACITY  # pylint: disable=global-statement
  _HLO = flags.DEFINE_string("hlo", None, "The program's HLO text (<program>_T<bucket>.hlo.txt.gz, or plain text).")
  _CHIP = flags.DEFINE_enum("chip", "v5p", ["v4", "v5e", "v5p", "v6e", "h100", "h200"],
                            "The chip (TPU) or GPU the program was compiled for.")
  _CHIPS = flags.DEFINE_integer("chips", 0, "Chips the program runs on (for the MFU; 0: from --report).")
  _TOP = flags.DEFINE_integer("top", 30, "How many of the most expensive instructions to list.")
  _MODEL_FLOPS = flags.DEFINE_float("model_flops", 0.0, "Model FLOPs of the whole step over all chips (PaLM's "
                                    "count, the report's analytic_flops); 0: from --report.")
  _REPORT = flags.DEFINE_string("report", "", "The compile report's JSON (compile_tpu.py --out): the row of this "
                                "program and bucket gives XLA's figures, the model FLOPs and the chip count.")
  _EXPERT_SHARDS = flags.DEFINE_integer("expert_shards", 1, "The program's `expert` mesh axis: > 1 prices the "
                                        "grouped matmuls by the local experts' rows under balanced routing.")
  _CAPACITY = flags.DEFINE_float("moe_capacity_factor", 0.0, "The program's model.moe_capacity_factor (> 0: its "
                                 "grouped matmuls run on chunks of this × the balanced share; with --expert_shards).")
  flags.mark_flags_as_required(["hlo"])


def report_row(path: str, hlo_path: str) -> dict:
  """The report's row for the program and bucket named by the HLO file (`<program>_T<bucket>.hlo.txt[.gz]`)."""
  match = re.match(r"(.+)_T(\d+)\.hlo\.txt(\.gz)?$", os.path.basename(hlo_path))
  if not match:
    raise ValueError(f"--report: cannot tell the program and bucket from the file name {hlo_path!r}")
  with open(path) as f:
    rows = json.load(f)
  for row in rows:
    if row.get("program") == match.group(1) and int(row.get("bucket", -1)) == int(match.group(2)):
      return row
  raise ValueError(f"--report: {path} has no row for {match.group(1)} at T={match.group(2)}")


def _share_table(title: str, shares: dict[str, float], total: float, extra=None) -> list[str]:
  lines = [f"{title:<22}{'seconds':>10}{'share':>8}" + (f"  {extra[0]}" if extra else "")]
  for key, seconds in shares.items():
    lines.append(f"  {key:<20}{seconds:>10.4f}{100 * seconds / total:>7.1f}%" +
                 (f"  {extra[1](key)}" if extra else ""))
  return lines


def short_op_name(op_name: str, width: int = 110) -> str:
  """The jax op name without the loop / call plumbing that every op inside the layer scan repeats."""
  name = re.sub(r"(while/body/|closed_call/|checkpoint/|rematted_computation/)", "", op_name)
  name = re.sub(r"^jit\([^)]*\)/", "", name)
  return name if len(name) <= width else "…" + name[-(width - 1):]


def overlap_headline(overlap, mfu) -> str:
  """The schedule-aware estimate (`sao.aot.hlo_overlap`): the serial sum less what the schedule hides."""
  return (f"  time, schedule-aware  {overlap.overlapped:12.3f} s      MFU {mfu(overlap.overlapped)}   (Σ less "
          f"{overlap.hidden_total:.3f} s of async collectives run under the compute between start and done)")


def overlap_table(overlap) -> list[str]:
  """Seconds of collectives by kind: async (hidden / exposed by the schedule) and synchronous."""
  kinds = sorted(set(overlap.async_seconds) | set(overlap.sync_seconds),
                 key=lambda k: -(overlap.async_seconds.get(k, 0) + overlap.sync_seconds.get(k, 0)))
  row = lambda name, run, hidden, sync: f"  {name:<22}{run:>10.4f}{hidden:>10.4f}{run - hidden:>10.4f}{sync:>10.4f}"
  lines = [f"{'collectives':<24}{'async s':>10}{'hidden s':>10}{'exposed s':>10}{'sync s':>10}"]
  lines += [row(k, overlap.async_seconds.get(k, 0.0), overlap.hidden.get(k, 0.0), overlap.sync_seconds.get(k, 0.0))
            for k in kinds]
  lines.append(row("all", sum(overlap.async_seconds.values()), overlap.hidden_total,
                   sum(overlap.sync_seconds.values())))
  lines.append(f"  async collectives executed {overlap.async_pairs:.0f}; compute that hid nothing "
               f"{overlap.spare:.3f} s. A `… fusion` row is a collective fused with its slicing: priced by its HBM "
               "bytes in the serial sum, synchronous here.")
  return lines


def format_breakdown(result, chip, chips: int, model_flops: float, row: dict | None, top: int,
                     overlap=None) -> str:
  ops = result.ops
  seconds = result.total()
  flops = sum(o.count * o.flops for o in ops)
  work = sum(o.count * o.mxu_flops for o in ops)  # f32 matmuls at high / highest precision: 3 / 6 bf16 passes
  hbm = sum(o.count * o.bytes for o in ops if o.kind != "collective")
  ici = sum(o.count * o.bytes for o in ops if o.kind == "collective")
  roofline = max(work / chip.peak_bf16_flops, hbm / chip.hbm_bytes_per_second)
  mfu = lambda s: f"{100 * model_flops / (s * chips * chip.peak_bf16_flops):.1f}%" if model_flops and chips and s \
      else "-"
  lines = [f"per chip, {chip.name}: {chip.peak_bf16_flops / 1e12:.0f} TFLOP/s bf16, "
           f"{chip.hbm_bytes_per_second / 1e9:.0f} GB/s HBM, {chip.ici_ring_bytes_per_second / 1e9:.0f} GB/s ICI ring"
           f" (a cost model, not a measurement)",
           f"  matmul FLOPs          {flops / 1e12:12.2f} TFLOP   (loop bodies once: {result.flops_once / 1e12:.3f}"
           + (f"; XLA's cost analysis, all ops, loop bodies once: {row['xla_flops'] / max(chips, 1) / 1e12:.3f}"
              if row and row.get("xla_flops") else "") + ")",
           f"  MXU work              {work / 1e12:12.2f} TFLOP   (the FLOPs × bf16 passes: an f32 matmul at high "
           f"precision runs 3, at highest 6)",
           f"  HBM bytes             {hbm / 1e9:12.1f} GB",
           f"  ICI bytes             {ici / 1e9:12.1f} GB",
           f"  time, Σ instructions  {seconds:12.3f} s      MFU {mfu(seconds)}",
           f"  time, roofline of Σ   {roofline:12.3f} s      MFU {mfu(roofline)}   (max(Σ MXU work / peak, "
           f"Σ HBM bytes / bandwidth), collectives left out)"]
  if overlap is not None:
    lines.insert(-1, overlap_headline(overlap, mfu))
  if row and row.get("estimated_seconds"):
    lines.append(f"  report's estimate     {row['estimated_seconds']:12.3f} s      MFU {mfu(row['estimated_seconds'])}"
                 f"   ({row.get('estimate_source', '')})")
  if model_flops:
    lines.append(f"  model FLOPs           {model_flops / 1e12:12.1f} TFLOP over {chips} chips "
                 f"({model_flops / max(chips, 1) / 1e12:.2f} per chip; matmul FLOPs / model FLOPs per chip = "
                 f"{flops * chips / model_flops:.2f})")
  if result.conditional_seconds:
    lines.append(f"  inside conditionals   {result.conditional_seconds:12.3f} s      (their most expensive branch "
                 f"counted: an upper bound)")
    cheapest = seconds - result.conditional_savings
    lines.append(f"  time, cheapest branches {cheapest:10.3f} s      MFU {mfu(cheapest)}   (Σ with every conditional's "
                 "cheapest branch instead: which one runs is data)")
  if result.unknown_trip_counts:
    lines.append("  loops with no trip count found (counted once): " + "; ".join(result.unknown_trip_counts[:5]))
  if overlap is not None:
    lines += [""] + overlap_table(overlap)
  by = lambda key: {k: (sum(o.count * o.flops for o in ops if getattr(o, key) == k),
                        sum(o.count * o.bytes for o in ops if getattr(o, key) == k),
                        sum(o.count * o.mxu_flops for o in ops if getattr(o, key) == k)) for k in result.share(key)}
  for key, title in (("kind", "by kind"), ("part", "by model part"), ("phase", "by phase"), ("bound", "by bound")):
    amounts = by(key)
    lines += [""] + _share_table(title, result.share(key), seconds,
                                 ("  TFLOP        GB  s at peak",
                                  lambda k, a=amounts: f"{a[k][0] / 1e12:9.2f} {a[k][1] / 1e9:9.1f} "
                                                       f"{a[k][2] / chip.peak_bf16_flops:10.3f}"))
  lines += ["", f"top {top} instructions (total seconds = count × seconds per execution)",
            f"{'seconds':>9}{'share':>7}{'count':>8} {'kind':<15}{'bound':<8}{'TFLOP/x':>9}{'GB/x':>8}  "
            f"{'instruction':<28}{'shape':<30}op name"]
  for o in sorted(ops, key=lambda o: -o.total_seconds)[:top]:
    lines.append(f"{o.total_seconds:9.4f}{100 * o.total_seconds / seconds:6.1f}%{o.count:8.0f} {o.kind:<15}"
                 f"{o.bound:<8}{o.flops / 1e12:9.4f}{o.bytes / 1e9:8.3f}  {o.name[:27]:<28}{o.shape[:29]:<30}"
                 f"{short_op_name(o.op_name)}")
  if result.unknown_custom_calls:
    lines += ["", "custom calls with no FLOP model (bytes counted, FLOPs 0): " +
              ", ".join(f"{k} ×{v:.0f}" for k, v in result.unknown_custom_calls.items())]
  return "\n".join(lines)


def main(argv):
  del argv
  from sao.aot import hlo_cost, hlo_overlap, hlo_text, instruction_time, tpu_topology  # pylint: disable=g-import-not-at-top
  chip = tpu_topology.chip_named(_CHIP.value)
  row = report_row(_REPORT.value, _HLO.value) if _REPORT.value else None
  chips = _CHIPS.value or (int(row["chips"]) if row and row.get("chips") else 0)
  model_flops = _MODEL_FLOPS.value or (float(row["analytic_flops"]) if row else 0.0)
  module = hlo_text.read_module(_HLO.value)
  share, why = instruction_time.grouped_row_share(_EXPERT_SHARDS.value, _CAPACITY.value)
  result, overlap = hlo_cost.breakdown(module, chip, share), hlo_overlap.overlap(module, chip, share)
  print(f"{_HLO.value}: {len(result.ops)} executed instructions" +
        (f"; grouped matmuls priced by {why} (balanced routing)" if share < 1 else ""))
  print(format_breakdown(result, chip, chips, model_flops, row, _TOP.value, overlap))


if __name__ == "__main__":
  define_flags()
  app.run(main)
