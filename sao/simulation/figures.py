"""The fleet simulator's figure: one line per (algorithm, flow control) over the number of agent loops.

Panels: trajectories trained per hour (with what linear concurrency scaling assumes, dotted), the trainer's busy
fraction, staleness (mean, with the 99th percentile as the bar's top), and the share of finished episodes' work
discarded as stale. matplotlib runs on the Agg backend (no display), as in `sao.analysis.figures`.
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

PANELS = (("trained_per_hour", "trajectories trained / hour"), ("busy", "trainer busy fraction"),
          ("staleness_mean", "staleness (versions; bar: p99)"), ("discarded_fraction", "work discarded as stale"))


def plot_fleet(rows: Sequence[Mapping[str, Any]], out_path: str) -> str:
  """`rows`: `FleetReport.summary()` dicts with "algorithm" and "flow_control" added. Writes `out_path`."""
  if not rows:
    raise ValueError("plot_fleet: no rows")
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.6))
  lines = sorted({(r["algorithm"], r["flow_control"]) for r in rows})
  for ax, (key, title) in zip(axes, PANELS):
    for algorithm, flow_control in lines:
      sel = sorted((r for r in rows if (r["algorithm"], r["flow_control"]) == (algorithm, flow_control)),
                   key=lambda r: r["loops"])
      x = [r["loops"] for r in sel]
      y = [r[key] for r in sel]
      label = f"{algorithm}, {flow_control}"
      if key == "staleness_mean":
        upper = [r["staleness_p99"] - r["staleness_mean"] for r in sel]
        ax.errorbar(x, y, yerr=[[0] * len(y), upper], marker="o", capsize=3, label=label)
      else:
        ax.plot(x, y, marker="o", label=label)
      if key == "trained_per_hour" and flow_control == lines[0][1]:
        ax.plot(x, [r["linear_per_hour"] for r in sel], linestyle=":", color="gray")
    ax.set_xscale("log", base=2)
    if key == "trained_per_hour":
      ax.set_yscale("log")
    ax.set_xlabel("agent loops")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7)
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  fig.tight_layout()
  fig.savefig(out_path, dpi=90)
  plt.close(fig)
  return out_path
