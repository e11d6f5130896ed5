"""The compile-report tables of docs/ are rendered from the committed row files (`experiments/render_reports.py`)."""
import json
import os

import pytest

from sao.aot import report_docs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")


def test_docs_tables_match_their_report_files():
  stale = report_docs.stale_pages(DOCS)
  assert not stale, f"{stale}: rendered tables differ from their report files; run python experiments/render_reports.py"


def test_every_committed_report_file_is_rendered_somewhere():
  rendered = set()
  for page in report_docs.pages_with_blocks(DOCS):
    text = open(page).read()
    for match in report_docs._BLOCK.finditer(text):  # pylint: disable=protected-access
      rendered.update(os.path.normpath(os.path.join(os.path.dirname(page), n)) for n in match.group(3).split())
  files = {os.path.normpath(os.path.join(DOCS, "reports", n)) for n in os.listdir(os.path.join(DOCS, "reports"))
           if n.endswith(".json")}
  assert files <= rendered, f"report files no page renders: {sorted(files - rendered)}"


def test_every_rendered_report_counts_attention_causal():
  """The project's model FLOPs count attention causal (`compile_stats.analytic_flops`): a report rendered in docs/
  whose rows hold PaLM's full-attention count is recounted (`experiments/bench/mfu_conventions.py --rewrite`). A row
  written before the field existed holds the full count, and a table over both kinds says that it mixes them."""
  from sao.aot import report, report_table  # pylint: disable=g-import-not-at-top
  reports = os.path.join(DOCS, "reports")
  for name in sorted(n for n in os.listdir(reports) if n.endswith(".json")):
    with open(os.path.join(reports, name)) as f:
      records = json.load(f)
    rows = [report.row_from_dict(r) for r in records]
    assert {r.model_flops_convention for r in rows} == {"causal_attention"}, name
    assert "MaxText's count" in report_table.convention_of(rows)
  before = report.row_from_dict({k: v for k, v in records[0].items() if k != "model_flops_convention"})
  assert before.model_flops_convention == "full_attention"
  assert "MIXES COUNTS" in report_table.convention_of([rows[0], before])


def _page(tmp_path, rows):
  (tmp_path / "reports").mkdir()
  (tmp_path / "reports" / "r.json").write_text(json.dumps(rows))
  page = tmp_path / "p.md"
  page.write_text("intro\n<!-- render: table reports/r.json -->\n<!-- end render -->\nafter\n")
  report_docs.write_pages(str(tmp_path))
  return page


def test_a_table_that_drifts_from_its_file_is_found_and_names_each_rows_commit(tmp_path):
  rows = json.load(open(os.path.join(DOCS, "reports", "sao_full_v5p128.json")))
  page = _page(tmp_path, rows)
  text = page.read_text()
  assert text.startswith("intro\n<!-- render: table reports/r.json -->\n    compiled from ")
  assert text.endswith("<!-- end render -->\nafter\n")
  assert report_docs.stale_pages(str(tmp_path)) == []
  body = [l for l in text.splitlines() if l.startswith("    actor_step_dis ")]
  assert len(body) == len({r["bucket"] for r in rows})
  commits = {r["bucket"]: r["code_version"][:7] for r in rows if r["program"] == "actor_step_dis"}
  for line in body:  # the row's own commit ends its line
    assert line.endswith(commits[int(line.split()[1])])
  # One number of one row changes in the file: the page is stale until re-rendered.
  rows[0]["temp_bytes"] += 1 << 30
  (tmp_path / "reports" / "r.json").write_text(json.dumps(rows))
  assert report_docs.stale_pages(str(tmp_path)) == [str(page)]
  report_docs.write_pages(str(tmp_path))
  assert report_docs.stale_pages(str(tmp_path)) == []


def test_a_file_whose_rows_mix_topologies_is_refused(tmp_path):
  rows = json.load(open(os.path.join(DOCS, "reports", "sao_full_v5p128.json")))[:2]
  rows[1] = dict(rows[1], topology="v6e:16x16")
  with pytest.raises(ValueError, match="disagree on topology"):
    _page(tmp_path, rows)


def test_a_bucket_whose_update_is_not_compiled_yet_gets_no_estimate(tmp_path):
  rows = json.load(open(os.path.join(DOCS, "reports", "sao_full_v5p128.json")))
  rows = [r for r in rows if not (r["program"] == "actor_step_dis" and r["bucket"] == 131072)]
  text = _page(tmp_path, rows).read_text()
  assert "update at T=131072: not compiled yet (actor_step_dis)" in text
  assert "update at T=32768: per-instruction sum" in text or "update at T=32768: XLA-estimated" in text
