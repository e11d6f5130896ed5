"""The learner layout a run should use, chosen by the cost model from the committed compile reports.

A layout is one experiment config's mesh and micro-batches (`sao_openswe.py:full`: `fsdp` 8 × `tensor` 16, fits
131,072 tokens; `:full_64k`: the expert-parallel mesh, up to 65,536). Its compile report prices one update per
bucket (`report_table.update_estimates`, the per-instruction serial sum). A run's episodes are at most `max_tokens`
long, so the trainer pads to the buckets up to the one that holds `max_tokens`: a layout qualifies when its report has
a priced update, every program fitting, at each of those buckets, and the fastest qualifying layout at the longest
of them — the update a full-length batch costs — is the choice. Per bucket, the fastest layout that fits it.
"""
from __future__ import annotations

import dataclasses

from sao.aot import report_docs, report_table


@dataclasses.dataclass(frozen=True)
class Layout:
  """One report file: its name (the config and its overrides) and, per bucket, one update's per-instruction seconds
  or why it has none (does not fit, not compiled, not priced)."""
  name: str
  path: str
  updates: dict[int, float | str]

  @classmethod
  def load(cls, path: str) -> "Layout":
    rows = report_docs.RowFile.load(path)
    first = rows.records[0]
    estimates = report_table.update_estimates(rows.rows(), rows.chip, rows.chips, per_instruction=True)
    name = f"{first['config']} ({first['config_overrides'] or 'no overrides'}) on {first['topology']}"
    return cls(name, path, {b: e if isinstance(e, str) else e[0] for b, e in estimates.items()})

  def seconds(self, bucket: int) -> float | None:
    value = self.updates.get(bucket)
    return value if isinstance(value, float) else None


def fastest_per_bucket(layouts: list[Layout]) -> dict[int, tuple[Layout, float] | None]:
  """Per bucket of any report: the layout with the fastest priced update there, or None where none has one."""
  out = {}
  for bucket in sorted({b for layout in layouts for b in layout.updates}):
    priced = [(layout, layout.seconds(bucket)) for layout in layouts if layout.seconds(bucket) is not None]
    out[bucket] = min(priced, key=lambda p: p[1]) if priced else None
  return out


def choose(layouts: list[Layout], max_tokens: int) -> tuple[Layout, int, float]:
  """(the layout, the bucket that holds `max_tokens`, its update seconds there) for a run whose episodes are at most
  `max_tokens` long; ValueError naming each layout's gap when none qualifies."""
  gaps = []
  best = None
  for layout in layouts:
    holding = [b for b in sorted(layout.updates) if b >= max_tokens]
    if not holding:
      gaps.append(f"{layout.name}: no bucket holds {max_tokens} tokens (largest {max(layout.updates)})")
      continue
    needed = [b for b in sorted(layout.updates) if b <= holding[0]]
    missing = [f"{b}: {layout.updates[b]}" for b in needed if layout.seconds(b) is None]
    if missing:
      gaps.append(f"{layout.name}: {'; '.join(missing)}")
      continue
    seconds = layout.seconds(holding[0])
    if best is None or seconds < best[2]:
      best = (layout, holding[0], seconds)
  if best is None:
    raise ValueError(f"no layout runs episodes of {max_tokens} tokens: " + " | ".join(gaps))
  return best
