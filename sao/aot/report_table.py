"""The compile report's text table: one line per (program, bucket) row, then one update-estimate line per bucket.

`experiments/compile_tpu.py` prints it at the end of a run; `sao.aot.report_docs` renders the tables of docs/ from
the committed row files with the same functions, so a table in the docs is what the command printed for its file.

Columns (per chip unless stated): argument / temporary / output / total HBM in GiB and the chip's capacity; XLA's
FLOPs, the program's FLOPs (loop trip counts applied) and the model's analytic FLOPs, all TFLOP per call over all
chips; XLA's estimated seconds per call and the MFU it implies, model FLOPs / (est s · chips · peak bf16 FLOP/s);
the per-instruction serial sum of the compiled HLO (`sao.aot.instruction_time`, the measure issue 44's targets use)
and its MFU. XLA's estimate counts no FLOPs inside custom calls (the Pallas kernels of splash attention and megablox),
so where those kernels carry the work it can imply more than 100 % MFU; the per-instruction sum prices them.
With `commits`, a last column names the commit each row was compiled from (the first 7 hex digits).
"""
from __future__ import annotations

from typing import Sequence

GIB = float(1 << 30)


def _fmt(value, spec: str, missing: str = "-") -> str:
  return missing if value is None else format(value, spec)


def _failed(row) -> bool:
  return getattr(row, "status", "") == "failed"  # a `report.ReportRow` whose compile raised


def short_commit(code_version: str) -> str:
  """`049dd62f…` → `049dd62`; a dirty tree's `<sha>+dirty.<hash>` keeps its mark (`049dd62+dirty`)."""
  sha, _, rest = code_version.partition("+")
  return sha[:7] + ("+dirty" if rest else "")


def row_line(r, chip, commit: str = "") -> str:
  fits = "FAIL" if _failed(r) else "yes" if r.fits else "NO"
  line = (
      f"{r.program:<20}{r.bucket:>7}{r.batch:>5}{r.calls:>6} {r.argument_bytes / GIB:>8.2f}{r.temp_bytes / GIB:>9.2f}"
      f"{r.output_bytes / GIB:>8.2f}{r.hbm_bytes_per_chip / GIB:>9.2f}{chip.hbm_bytes / GIB:>5.0f}  "
      f"{fits:<5}{_fmt(r.xla_flops / 1e12 if r.xla_flops else None, '.3e'):>11}"
      f"{r.flops / 1e12:>11.3e}{r.analytic_flops / 1e12:>11.3e}{_fmt(r.estimated_seconds, '.3e'):>10}"
      f"{_fmt(None if r.estimated_mfu is None else 100 * r.estimated_mfu, '.1f'):>6}%"
      f"{'  ' if r.estimate_source != 'roofline_of_xla_counts' else ' r'}"
      f"{_fmt(getattr(r, 'instruction_seconds', None), '.3e'):>10}"
      f"{_fmt(None if getattr(r, 'instruction_mfu', None) is None else 100 * r.instruction_mfu, '.1f'):>6}%")
  return f"{line}  {commit}" if commit else line.rstrip()


CONVENTIONS = {"causal_attention": "counts attention causal (MaxText's count)",
               "full_attention": "counts attention full (PaLM's count, twice the causal attention term)"}


def convention_of(rows) -> str:
  """How the rows' model FLOPs count attention (`ProgramRow.model_flops_convention`); rows that disagree are named."""
  found = sorted({getattr(r, "model_flops_convention", "full_attention") for r in rows})
  if len(found) == 1:
    return CONVENTIONS.get(found[0], found[0])
  return "MIXES COUNTS (" + ", ".join(found) + "): the update lines add them; recount with mfu_conventions.py --rewrite"


def format_table(rows, chip, commits: Sequence[str] = ()) -> str:
  """The table of `rows` (`report.ReportRow`s) on `chip`; `commits[i]` (optional) is row i's commit."""
  if commits and len(commits) != len(rows):
    raise ValueError(f"format_table: {len(commits)} commits for {len(rows)} rows")
  header = (f"{'program':<20}{'T':>7}{'B':>5}{'calls':>6} {'args':>8}{'temp':>9}{'out':>8}{'total':>9}"
            f"{'/cap':>5}  {'fits':<5}{'xla TF':>11}{'program TF':>11}{'model TF':>11}{'est s':>10}{'MFU':>7}"
            f"{'instr s':>12}{'MFU':>7}" + ("  commit" if commits else ""))
  lines = [f"HBM GiB per chip ({chip.name}: {chip.hbm_bytes / GIB:.0f} GiB); TFLOPs per step over all chips; model "
           f"TF {convention_of(rows)}; est s "
           f"and MFU are XLA's cost-model estimate (r: roofline of XLA's FLOP and byte counts, where XLA's own time "
           f"was not positive; no FLOPs inside custom calls), instr s and MFU the per-instruction serial sum of the "
           f"compiled HLO (sao.aot.instruction_time); cost models, not measurements", header, "-" * len(header)]
  lines += [row_line(r, chip, commits[i] if commits else "") for i, r in enumerate(rows)]
  for r in rows:
    if _failed(r):
      lines.append(f"failed: {r.program} at T={r.bucket}: {r.error}")
    elif not r.fits:
      lines.append(f"does not fit: {r.program} at T={r.bucket}: {r.error}")
      for b in r.largest_buffers:
        lines.append(f"    {b['size'] / GIB:9.2f} GiB {b['kind']:<9} {b['shape']:<28} {b['instruction']} "
                     f"{b['op_name'][-110:]}")
  return "\n".join(lines)


def update_estimates(rows, chip, chips: int,
                     per_instruction: bool = False) -> dict[int, tuple[float, float, float] | str]:
  """Per bucket: (estimated seconds of one update = Σ calls · est s, its model FLOPs, the MFU they imply) when every
  program the update calls fits, else a string naming the programs that do not fit, failed or are not compiled yet
  (a program another bucket's rows call). `per_instruction`: Σ calls · the per-instruction sum instead, and a string
  naming the programs without one."""
  out: dict[int, tuple[float, float, float] | str] = {}
  programs = {r.program for r in rows if r.calls}  # what one update calls, from every bucket's rows
  for bucket in sorted({r.bucket for r in rows}):
    at = [r for r in rows if r.bucket == bucket and r.calls]
    missing = sorted(programs - {r.program for r in at})
    if missing:  # a report still being compiled: no estimate from part of an update
      out[bucket] = f"not compiled yet ({', '.join(missing)})"
      continue
    if not all(r.fits for r in at):
      failed = [r.program for r in at if _failed(r)]
      too_big = [r.program for r in at if not r.fits and not _failed(r)]
      out[bucket] = "; ".join(([f"does not fit ({', '.join(too_big)})"] if too_big else []) +
                              ([f"compile failed ({', '.join(failed)})"] if failed else []))
      continue
    if per_instruction:
      unpriced = [r.program for r in at if getattr(r, "instruction_seconds", None) is None]
      if unpriced:
        out[bucket] = f"not priced per instruction ({', '.join(unpriced)})"
        continue
    seconds = sum(r.calls * ((r.instruction_seconds if per_instruction else r.estimated_seconds) or 0.0) for r in at)
    model = sum(r.calls * r.analytic_flops for r in at)
    out[bucket] = (seconds, model, model / (seconds * chips * chip.peak_bf16_flops) if seconds else 0.0)
  return out


def update_summary(rows, chip, chips: int) -> list[str]:
  """Per bucket: one update's estimated time (Σ calls · est s) and model FLOPs, when every program fits, and its
  per-instruction sum where every program has one."""
  lines = []
  instructions = update_estimates(rows, chip, chips, per_instruction=True)
  for bucket, estimate in update_estimates(rows, chip, chips).items():
    if isinstance(estimate, str):
      lines.append(f"update at T={bucket}: {estimate}")
      continue
    seconds, model, mfu = estimate
    priced = instructions[bucket]
    lines.append(f"update at T={bucket}: "
                 + (f"per-instruction sum {priced[0]:.4g} s (MFU {100 * priced[2]:.1f}%), "
                    if not isinstance(priced, str) else "")
                 + f"XLA-estimated {seconds:.4g} s (MFU {100 * mfu:.1f}%), {model / 1e12:.4g} model TFLOP")
  return lines
