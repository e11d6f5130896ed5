"""The compile-report tables of docs/, rendered from the committed row files (`experiments/render_reports.py`).

A block of a Markdown page between

    <!-- render: table reports/sao_full_v5p128.json -->
    <!-- end render -->

is what `report_table.format_table` and `update_summary` print for that row file (the path relative to the page),
indented as a code block, with a commit column and a line naming the commits the rows were compiled from; `summary`
instead of `table` renders a Markdown table with one line per file named after it (`summary a.json b.json …`):
rows, largest HBM per chip, the estimated update per bucket (the per-instruction sum where every program of the
update has one, else XLA's estimate, marked "XLA"). `check` is what the test suite runs: a page whose block
differs from its file fails, so a table in the docs cannot drift from the file it claims to show.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

from sao.aot import report, report_table, tpu_topology

_BLOCK = re.compile(r"(<!-- render: (table|summary) ([^>]+?) -->\n)(.*?)(<!-- end render -->)", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class RowFile:
  """One committed report file: its rows (sorted as `report.RowFile.report_rows` sorts them) and their settings."""
  path: str
  records: list[dict[str, Any]]

  @classmethod
  def load(cls, path: str) -> "RowFile":
    with open(path) as f:
      records = json.load(f)
    if not isinstance(records, list) or not records or not all(isinstance(r, dict) for r in records):
      raise ValueError(f"{path}: not a non-empty JSON list of report rows")
    for key in ("topology", "chips", "code_version", "config", "config_overrides"):
      values = {json.dumps(r.get(key)) for r in records} if key != "code_version" else {""}
      if len(values) > 1:
        raise ValueError(f"{path}: rows disagree on {key}: {sorted(values)}")
    return cls(path, sorted(records, key=lambda r: int(r["bucket"])))

  @property
  def chip(self) -> tpu_topology.Chip:
    return tpu_topology.parse_topology(self.records[0]["topology"])[0]

  @property
  def chips(self) -> int:
    return int(self.records[0]["chips"])

  def rows(self) -> list[report.ReportRow]:
    return [report.row_from_dict(r) for r in self.records]

  def commits(self) -> list[str]:
    return [report_table.short_commit(r.get("code_version", "unknown")) for r in self.records]


def _commit_line(rows: RowFile) -> str:
  by_commit: dict[str, set[int]] = {}
  for record, commit in zip(rows.records, rows.commits()):
    by_commit.setdefault(commit, set()).add(int(record["bucket"]))
  first = rows.records[0]
  parts = [f"{c} (T={', '.join(str(b) for b in sorted(bs))})" for c, bs in by_commit.items()]
  return (f"compiled from {'; '.join(parts)}; jax {first.get('jax_version')}, libtpu {first.get('libtpu_version')}; "
          f"{first['config']} ({first['config_overrides'] or 'no overrides'}) on {first['topology']}, "
          f"{first.get('num_layers')} layers, mesh {first.get('mesh')}")


def render_table(path: str) -> str:
  rows = RowFile.load(path)
  lines = [_commit_line(rows), report_table.format_table(rows.rows(), rows.chip, rows.commits()),
           *report_table.update_summary(rows.rows(), rows.chip, rows.chips)]
  return "".join(f"    {line}\n" if line else "\n" for line in "\n".join(lines).split("\n"))


def render_summary(paths: list[str], names: list[str]) -> str:
  out = ["| report file | config, topology | rows | largest HBM per chip | estimated update per bucket: s (MFU), "
         "per-instruction sum or XLA's estimate | compiled from |", "|---|---|---|---|---|---|"]
  for path, name in zip(paths, names):
    rows = RowFile.load(path)
    table_rows = rows.rows()
    largest = max(table_rows, key=lambda r: r.hbm_bytes_per_chip)
    xla = report_table.update_estimates(table_rows, rows.chip, rows.chips)
    priced = report_table.update_estimates(table_rows, rows.chip, rows.chips, per_instruction=True)

    def bucket_estimate(b: int) -> str:
      if isinstance(xla[b], str):
        return f"{b}: {xla[b]}"
      if not isinstance(priced[b], str):
        return f"{b}: {priced[b][0]:,.1f} s ({100 * priced[b][2]:.1f} %)"
      return f"{b}: {xla[b][0]:,.1f} s ({100 * xla[b][2]:.1f} %, XLA)"

    per_bucket = ", ".join(bucket_estimate(b) for b in xla)
    fits = sum(r.fits for r in table_rows)
    first = rows.records[0]
    out.append(f"| [`{os.path.basename(name)}`]({name}) | `{first['config']}` ({first['config_overrides']}), "
               f"{first['topology']} | {len(table_rows)} ({fits} fit) | {largest.hbm_bytes_per_chip / (1 << 30):.2f} "
               f"GiB of {rows.chip.hbm_bytes / (1 << 30):.0f} ({largest.program}, T={largest.bucket}) | "
               f"{per_bucket} | {', '.join(f'`{c}`' for c in dict.fromkeys(rows.commits()))} |")
  return "\n".join(out) + "\n"


def render_page(page_path: str, text: str) -> str:
  """`text` (the page at `page_path`) with every render block replaced by what its files render to."""
  base = os.path.dirname(page_path)

  def replace(match: re.Match) -> str:
    kind, names = match.group(2), match.group(3).split()
    paths = [os.path.join(base, n) for n in names]
    if kind == "table":
      if len(paths) != 1:
        raise ValueError(f"{page_path}: a table block names one file, not {names}")
      body = render_table(paths[0])
    else:
      body = render_summary(paths, names)
    return match.group(1) + body + match.group(5)

  return _BLOCK.sub(replace, text)


def pages_with_blocks(docs_dir: str) -> list[str]:
  return sorted(os.path.join(docs_dir, n) for n in os.listdir(docs_dir)
                if n.endswith(".md") and "<!-- render: " in open(os.path.join(docs_dir, n)).read())


def stale_pages(docs_dir: str) -> list[str]:
  """The pages under `docs_dir` whose render blocks differ from their files."""
  stale = []
  for page in pages_with_blocks(docs_dir):
    with open(page) as f:
      text = f.read()
    if render_page(page, text) != text:
      stale.append(page)
  return stale


def write_pages(docs_dir: str) -> list[str]:
  """Re-renders every block under `docs_dir`; returns the pages that changed."""
  changed = []
  for page in pages_with_blocks(docs_dir):
    with open(page) as f:
      text = f.read()
    new = render_page(page, text)
    if new != text:
      with open(page, "w") as f:
        f.write(new)
      changed.append(page)
  return changed
