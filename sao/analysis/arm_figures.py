"""Sweep figures: per arm, the mean curve over its complete runs with a 95 % band (t-interval on seeds at each x,
`sao.analysis.stats`), in three panels — validation over RL steps, reward (ten-point trailing mean) over RL steps,
and validation over wall minutes since each run's first logged step.

Each seed's curve is linearly interpolated onto a grid over the x range every seed of the arm covers (evaluations
arrive at different steps in different runs); the band needs two or more seeds.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from sao.analysis import stats
from sao.analysis.curves import running_mean
from sao.analysis.figures import _pyplot, _save
from sao.analysis.sweep_runs import SweepRun, evaluations

GRID_POINTS = 60


def _validation_xy(run: SweepRun, axis: str) -> tuple[np.ndarray, np.ndarray]:
  evals = evaluations(run.log)
  if not evals:
    return np.zeros(0), np.zeros(0)
  steps, _, values, times = map(np.asarray, zip(*evals))
  if axis == "minutes":
    first = min(float(r["time"]) for r in run.log.records if r.get("time") is not None)
    return (times - first) / 60.0, 100.0 * values
  return np.maximum(steps, 0).astype(float), 100.0 * values


def _reward_xy(run: SweepRun) -> tuple[np.ndarray, np.ndarray]:
  steps, values = run.log.series("reward")
  keep = steps >= 0
  return steps[keep].astype(float), running_mean(values[keep])


def mean_band(curves: Sequence[tuple[np.ndarray, np.ndarray]], level: float = stats.LEVEL
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(grid x, mean, low, high) over seeds' (x, y) curves on their shared x range; low/high NaN with one curve."""
  curves = [(x, y) for x, y in curves if x.size]
  if not curves:
    return (np.zeros(0),) * 4
  lo, hi = max(float(x.min()) for x, _ in curves), min(float(x.max()) for x, _ in curves)
  grid = np.linspace(lo, hi, GRID_POINTS) if hi > lo else np.asarray([lo])
  ys = np.stack([np.interp(grid, x, y) for x, y in (((x[np.argsort(x)]), y[np.argsort(x)]) for x, y in curves)])
  mean = ys.mean(axis=0)
  n = ys.shape[0]
  if n < 2:
    nan = np.full_like(mean, math.nan)
    return grid, mean, nan, nan
  half = stats.t_quantile(0.5 + level / 2.0, n - 1) * ys.std(axis=0, ddof=1) / math.sqrt(n)
  return grid, mean, mean - half, mean + half


def plot_arms(runs: Sequence[SweepRun], out_path: str, title: str = "") -> str:
  """The three panels (module docstring), one color per arm; only complete runs."""
  plt = _pyplot()
  arms: dict[str, list[SweepRun]] = {}
  for r in runs:
    if r.complete:
      arms.setdefault(r.arm, []).append(r)
  fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
  panels = ((axes[0], lambda r: _validation_xy(r, "step"), "RL step", "validation success %"),
            (axes[1], _reward_xy, "RL step", "reward (ten-point mean)"),
            (axes[2], lambda r: _validation_xy(r, "minutes"), "wall minutes", "validation success %"))
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for i, (arm, rs) in enumerate(sorted(arms.items())):
    color = colors[i % len(colors)]
    for ax, xy, xlabel, ylabel in panels:
      grid, mean, low, high = mean_band([xy(r) for r in rs])
      if not grid.size:
        continue
      ax.plot(grid, mean, color=color, lw=2, label=f"{arm} (n={len(rs)})")
      if np.isfinite(low).all():
        ax.fill_between(grid, low, high, color=color, alpha=0.2)
      ax.set_xlabel(xlabel)
      ax.set_ylabel(ylabel)
  axes[0].legend(fontsize=8)
  if title:
    fig.suptitle(title)
  return _save(fig, out_path)
