"""Renders the compile-report tables of docs/ from the committed row files under docs/reports/.

    python experiments/render_reports.py           # rewrite every `<!-- render: … -->` block of docs/*.md
    python experiments/render_reports.py --check   # exit 1 naming each page whose tables differ from their files

Run it after committing new rows (`experiments/compile_tpu.py --out=docs/reports/<file>.json --resume`);
`tests/aot/test_report_docs.py` fails while a page and its files disagree. `sao/aot/report_docs.py` says how a
block is written.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sao.aot import report_docs  # pylint: disable=wrong-import-position

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")


def main(argv: list[str]) -> int:
  if argv not in ([], ["--check"]):
    print(f"usage: {sys.argv[0]} [--check]", file=sys.stderr)
    return 2
  if argv == ["--check"]:
    stale = report_docs.stale_pages(DOCS)
    for page in stale:
      print(f"{os.path.relpath(page)}: a rendered table differs from its report file; run "
            "`python experiments/render_reports.py`", file=sys.stderr)
    return 1 if stale else 0
  for page in report_docs.write_pages(DOCS):
    print(f"rendered {os.path.relpath(page)}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
