r"""Chooses the learner layout for a run from the committed compile reports, by the cost model (the per-instruction
serial sum of one update, `sao.aot.layout_choice`):

    python experiments/choose_layout.py --report=docs/reports/sao_full_v5p128.json \
        --report=docs/reports/sao_full64k_v5p128.json [--max_tokens=65536]

prints each layout's update per bucket, the fastest layout per bucket, and, with `--max_tokens` (the run's longest
episode), the layout to launch. Exits 1 when no layout runs episodes that long.
"""
from __future__ import annotations

import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import)."""
  global _REPORTS, _MAX_TOKENS  # pylint: disable=global-statement
  _REPORTS = flags.DEFINE_multi_string("report", None, "A compile report's JSON row file (one per layout).",
                                       required=True)
  _MAX_TOKENS = flags.DEFINE_integer("max_tokens", 0, "The run's longest episode in tokens (0: no choice printed).")


def main(argv):
  del argv
  from sao.aot import layout_choice  # pylint: disable=g-import-not-at-top
  layouts = [layout_choice.Layout.load(p) for p in _REPORTS.value]
  for layout in layouts:
    per_bucket = ", ".join(f"{b}: {v:.2f} s" if isinstance(v, float) else f"{b}: {v}"
                           for b, v in sorted(layout.updates.items()))
    print(f"{layout.name} [{os.path.basename(layout.path)}]: one update per bucket (per-instruction sum) {per_bucket}")
  for bucket, best in layout_choice.fastest_per_bucket(layouts).items():
    print(f"T={bucket}: " + (f"fastest {best[0].name}, {best[1]:.2f} s" if best else "no layout fits and is priced"))
  if _MAX_TOKENS.value:
    try:
      layout, bucket, seconds = layout_choice.choose(layouts, _MAX_TOKENS.value)
    except ValueError as e:
      print(f"choose_layout: {e}", file=sys.stderr)
      sys.exit(1)
    print(f"episodes ≤ {_MAX_TOKENS.value} tokens: launch {layout.name} ({seconds:.2f} s per update at T={bucket})")


if __name__ == "__main__":
  define_flags()
  app.run(main)
