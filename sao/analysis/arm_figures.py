"""Sweep figures: per arm, the mean curve over its complete runs with a 95 % band (t-interval on seeds at each x,
`sao.analysis.stats`).

  `<sweep>_arms.png`     (`plot_arms`) every arm in three panels: validation over RL steps, reward (ten-point
                         trailing mean) over RL steps, and validation over wall minutes since each run's first
                         logged step
  `<sweep>_factors.png`  (`plot_factors`) for a sweep with a reference arm: one small panel per other arm,
                         validation over RL steps of that arm against the reference arm (readable where the arms
                         panel is not: nine overlapping bands for `toy_ablations`)

Each seed's curve is linearly interpolated onto a grid over the x range every seed of the arm covers (evaluations
arrive at different steps in different runs); the band needs two or more seeds.
"""
from __future__ import annotations

import math
import textwrap
from typing import Mapping, Sequence

import numpy as np

from sao.analysis import stats
from sao.analysis.curves import running_mean
from sao.analysis.figures import _pyplot, _save
from sao.analysis.sweep_runs import SweepRun, evaluations

GRID_POINTS = 60
FACTOR_COLUMNS = 4  # panels per row of the factors figure


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


def complete_by_arm(runs: Sequence[SweepRun]) -> dict[str, list[SweepRun]]:
  arms: dict[str, list[SweepRun]] = {}
  for r in runs:
    if r.complete:
      arms.setdefault(r.arm, []).append(r)
  return dict(sorted(arms.items()))


def _band(ax, curves: Sequence[tuple[np.ndarray, np.ndarray]], color: str, label: str, **line) -> None:
  """The mean of `curves` (`mean_band`) as a line on `ax`, its 95 % band shaded where there is one."""
  grid, mean, low, high = mean_band(curves)
  if not grid.size:
    return
  ax.plot(grid, mean, color=color, lw=2, label=label, **line)
  if np.isfinite(low).all():
    ax.fill_between(grid, low, high, color=color, alpha=0.2)


def plot_arms(runs: Sequence[SweepRun], out_path: str, title: str = "") -> str:
  """The three panels (module docstring), one color per arm; only complete runs."""
  plt = _pyplot()
  fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
  panels = ((axes[0], lambda r: _validation_xy(r, "step"), "RL step", "validation success %"),
            (axes[1], _reward_xy, "RL step", "reward (ten-point mean)"),
            (axes[2], lambda r: _validation_xy(r, "minutes"), "wall minutes", "validation success %"))
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for i, (arm, rs) in enumerate(complete_by_arm(runs).items()):
    for ax, xy, xlabel, ylabel in panels:
      _band(ax, [xy(r) for r in rs], colors[i % len(colors)], f"{arm} (n={len(rs)})")
      ax.set_xlabel(xlabel)
      ax.set_ylabel(ylabel)
  axes[0].legend(fontsize=8)
  if title:
    fig.suptitle(title)
  return _save(fig, out_path)


def plot_factors(runs: Sequence[SweepRun], reference: str, out_path: str, title: str = "",
                 factors: Mapping[str, str] | None = None, columns: int = FACTOR_COLUMNS) -> str:
  """One small panel per arm other than `reference` (a one-factor ablation each): validation over RL steps, that
  arm's mean curve and 95 % band against the reference arm's, all panels on the same axes; only complete runs.
  `factors` (arm → what it changes, the sweep's `ANALYSIS["factors"]`) titles the panels.

  Raises ValueError when `reference` or every other arm has no complete run.
  """
  arms = complete_by_arm(runs)
  if reference not in arms:
    raise ValueError(f"reference arm {reference!r} has no complete run (arms with one: {sorted(arms)})")
  others = [arm for arm in arms if arm != reference]
  if not others:
    raise ValueError(f"no complete run of any arm besides the reference arm {reference!r}")
  plt = _pyplot()
  columns = min(columns, len(others))
  rows = math.ceil(len(others) / columns)
  fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 3.0 * rows), sharex=True, sharey=True,
                           squeeze=False)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  reference_curves = [_validation_xy(r, "step") for r in arms[reference]]
  for i, ax in enumerate(axes.flat):
    if i >= len(others):
      ax.remove()  # the last row's empty cells
      continue
    arm = others[i]
    _band(ax, reference_curves, "0.45", f"{reference} (n={len(arms[reference])})", ls="--")
    _band(ax, [_validation_xy(r, "step") for r in arms[arm]], colors[0], f"{arm} (n={len(arms[arm])})")
    what = (factors or {}).get(arm)
    ax.set_title(textwrap.fill(f"{arm}: {what}" if what else arm, 48, break_on_hyphens=False), fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    if i % columns == 0:
      ax.set_ylabel("validation success %")
    if i + columns >= len(others):
      ax.set_xlabel("RL step")
      ax.xaxis.set_tick_params(labelbottom=True)
  if title:
    fig.suptitle(title)
  return _save(fig, out_path)
