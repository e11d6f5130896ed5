"""The per-instruction time each compile-report row records (`sao.aot.instruction_time`, `driver.price_instructions`)
and the command that adds it to rows compiled before it was recorded (`experiments/annotate_report.py`)."""
from __future__ import annotations

import dataclasses
import gzip
import json

import jax
import jax.numpy as jnp
import pytest
from absl import app

from experiments import annotate_report
from sao.aot import driver, instruction_time, report, report_docs, tpu_topology

V5P = tpu_topology.chip_named("v5p")


def _hlo_text() -> str:
  """A small compiled program: a loop of matmuls (the pricer multiplies the loop out)."""
  def f(x):
    return jax.lax.fori_loop(0, 4, lambda i, y: jnp.tanh(y @ x), x)
  return jax.jit(f).lower(jnp.ones((128, 128), jnp.float32)).compile().as_text()


def _row(program: str = "critic_values", bucket: int = 32) -> report.ReportRow:
  return report.ReportRow(program, bucket, 8, 1, "critic", False, True, 1, 2, 3, 6, V5P.hbm_bytes, 1e9, 1e9, 4e9,
                          1e-3, 0.3, 0.5)


def test_a_row_is_priced_by_the_serial_sum_of_its_hlo_and_its_mfu_follows():
  text = _hlo_text()
  seconds = instruction_time.serial_seconds(text, V5P)
  assert seconds > 0
  row = _row()
  driver.price_instructions(row, text, V5P, chips=4, row_share=1.0)
  assert row.instruction_seconds == seconds and row.instruction_error == ""
  assert row.instruction_mfu == pytest.approx(4e9 / (seconds * 4 * V5P.peak_bf16_flops))
  # A program with twice the loop trips costs more: the loop is multiplied out, not counted once.
  def g(x):
    return jax.lax.fori_loop(0, 8, lambda i, y: jnp.tanh(y @ x), x)
  longer = jax.jit(g).lower(jnp.ones((128, 128), jnp.float32)).compile().as_text()
  assert instruction_time.serial_seconds(longer, V5P) > 1.5 * seconds


def test_an_hlo_the_pricer_cannot_read_leaves_the_row_unpriced_saying_why():
  row = _row()
  driver.price_instructions(row, "this is not HLO", V5P, chips=4, row_share=1.0)
  assert row.instruction_seconds is None and row.instruction_mfu is None
  assert row.instruction_error  # the reason, for the report file


def _records(tmp_path, mesh=None):
  settings = {"topology": "v5p:2x2x1", "chips": 4, "config": "c", "config_overrides": "", "code_version": "abc1234",
              "mesh": mesh or {"fsdp": 4, "expert": 1, "tensor": 1}}
  hlo_dir = tmp_path / "hlo"
  hlo_dir.mkdir()
  with gzip.open(driver.hlo_path(str(hlo_dir), "critic_values", 32), "wt") as f:
    f.write(_hlo_text())
  records = [dict(dataclasses.asdict(_row("critic_values", 32)), **settings),
             dict(dataclasses.asdict(_row("actor_step_dis", 32)), **settings)]  # no HLO saved for this one
  for r in records:  # as rows compiled before the time was recorded
    for key in ("instruction_seconds", "instruction_mfu", "grouped_row_share", "instruction_error"):
      del r[key]
  return records, str(hlo_dir)


def test_annotate_prices_the_rows_whose_hlo_was_saved_and_keeps_the_rest(tmp_path):
  records, hlo_dir = _records(tmp_path)
  priced, skipped = annotate_report.annotate(records, hlo_dir, None)
  assert len(priced) == 1 and "critic_values T=32" in priced[0]
  assert len(skipped) == 1 and "actor_step_dis T=32 (no " in skipped[0]
  expected = instruction_time.serial_seconds(_hlo_text(), V5P)
  assert records[0]["instruction_seconds"] == pytest.approx(expected)
  assert records[0]["code_version"] == "abc1234"  # the row keeps the commit that compiled it
  assert "instruction_seconds" not in records[1]
  priced, skipped = annotate_report.annotate(records, hlo_dir, None)  # a second run changes nothing
  assert priced == [] and "critic_values T=32 (already priced)" in skipped
  records[0]["instruction_seconds"] = 99.0  # as priced by an older cost model: --reprice prices it again
  priced, _ = annotate_report.annotate(records, hlo_dir, None, reprice=True)
  assert len(priced) == 1 and records[0]["instruction_seconds"] == pytest.approx(expected)


def test_annotate_needs_the_capacity_factor_of_an_expert_parallel_row(tmp_path):
  records, hlo_dir = _records(tmp_path, mesh={"fsdp": 1, "expert": -1, "tensor": 2})  # expert resolves to 2
  assert annotate_report.expert_shards(records[0]) == 2
  with pytest.raises(app.UsageError, match="moe_capacity_factor"):
    annotate_report.annotate(records, hlo_dir, None)
  annotate_report.annotate(records, hlo_dir, 2.0)
  assert records[0]["grouped_row_share"] == 0.5


def test_the_tables_show_the_per_instruction_sum_once_every_program_has_one(tmp_path):
  settings = {"topology": "v5p:2x2x1", "chips": 4, "config": "c", "config_overrides": "", "code_version": "abc1234",
              "mesh": {"fsdp": 4}, "num_layers": 2}
  rows = []
  for program, seconds in (("critic_values", 2.0), ("actor_step_dis", 3.0)):
    row = _row(program, 32)
    row.instruction_seconds, row.instruction_mfu = seconds, 0.1
    rows.append(dict(dataclasses.asdict(row), **settings))
  (tmp_path / "reports").mkdir()
  (tmp_path / "reports" / "r.json").write_text(json.dumps(rows))
  page = tmp_path / "p.md"
  page.write_text("<!-- render: table reports/r.json -->\n<!-- end render -->\n"
                  "<!-- render: summary reports/r.json -->\n<!-- end render -->\n")
  report_docs.write_pages(str(tmp_path))
  text = page.read_text()
  mfu = 2 * 4e9 / (5.0 * 4 * V5P.peak_bf16_flops)
  assert f"update at T=32: per-instruction sum 5 s (MFU {100 * mfu:.1f}%), XLA-estimated" in text
  assert f"| 32: 5.0 s ({100 * mfu:.1f} %) |" in text
  del rows[1]["instruction_seconds"]  # one program unpriced: the update falls back to XLA's estimate, marked
  (tmp_path / "reports" / "r.json").write_text(json.dumps(rows))
  report_docs.write_pages(str(tmp_path))
  text = page.read_text()
  assert "update at T=32: XLA-estimated" in text and "(MFU" in text and ", XLA) |" in text
