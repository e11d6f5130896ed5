"""Means over seeds with 95 % intervals, and differences between arms, for the sweep tables.

Method (stated in every table that uses it): a Student-t interval on the seeds,

    mean ± t_{1 − α/2, n − 1} · s / √n,      s² = Σ (x_i − x̄)² / (n − 1),

computed in float64. A difference between two arms is paired by seed when both arms have the same seeds (seed k
starts every arm from the same supervised base policy and task lists): the t-interval of the per-seed differences.
Otherwise (a seed missing from one arm) it is Welch's interval, `x̄_a − x̄_b ± t_{1 − α/2, ν} · √(s_a²/n_a + s_b²/n_b)`
with the Welch–Satterthwaite ν. With n < 2 there is no interval (NaN bounds). Non-finite values (a run that never
reached a threshold) are left out; `n` says how many seeds an interval rests on.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np

LEVEL = 0.95


@dataclasses.dataclass(frozen=True)
class Interval:
  mean: float
  low: float
  high: float
  n: int
  method: str  # "t" (one arm), "paired t", "Welch t"

  @property
  def half_width(self) -> float:
    return (self.high - self.low) / 2.0


def t_quantile(p: float, df: float) -> float:
  """The Student-t quantile `t_{p, df}` (df > 0, may be fractional)."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  if not df > 0:
    raise ValueError(f"t_quantile: df must be > 0, got {df}")
  return float(stats.t.ppf(p, df))


def _finite(values: Sequence[float]) -> np.ndarray:
  x = np.asarray(values, np.float64)
  return x[np.isfinite(x)]


def mean_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
  """The t-interval of the finite `values` (module docstring)."""
  x = _finite(values)
  n = int(x.size)
  if n == 0:
    return Interval(math.nan, math.nan, math.nan, 0, "t")
  mean = float(x.mean())
  if n < 2:
    return Interval(mean, math.nan, math.nan, n, "t")
  half = t_quantile(0.5 + level / 2.0, n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
  return Interval(mean, mean - half, mean + half, n, "t")


def welch_interval(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Interval:
  """Welch's interval of `mean(a) − mean(b)` over the finite values."""
  x, y = _finite(a), _finite(b)
  n = min(x.size, y.size)
  mean = float(x.mean() - y.mean()) if x.size and y.size else math.nan
  if x.size < 2 or y.size < 2:
    return Interval(mean, math.nan, math.nan, int(n), "Welch t")
  vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
  se = math.sqrt(vx + vy)
  if se == 0.0:
    return Interval(mean, mean, mean, int(n), "Welch t")
  df = (vx + vy) ** 2 / (vx ** 2 / (x.size - 1) + vy ** 2 / (y.size - 1))
  half = t_quantile(0.5 + level / 2.0, df) * se
  return Interval(mean, mean - half, mean + half, int(n), "Welch t")


def difference_interval(a: Mapping[int, float], b: Mapping[int, float], level: float = LEVEL) -> Interval:
  """`a − b` for per-seed values `{seed: value}`: paired when both have finite values for the same seeds, else
  Welch (module docstring)."""
  fa = {k: v for k, v in a.items() if math.isfinite(v)}
  fb = {k: v for k, v in b.items() if math.isfinite(v)}
  if fa and set(fa) == set(fb):
    diffs = [fa[k] - fb[k] for k in sorted(fa)]
    return dataclasses.replace(mean_interval(diffs, level), method="paired t")
  return welch_interval(list(fa.values()), list(fb.values()), level)


def ratio_interval(a: Mapping[int, float], b: Mapping[int, float], level: float = LEVEL) -> Interval:
  """`a / b` per seed (the seeds both have, finite and b ≠ 0), then the t-interval of those ratios."""
  ratios = [a[k] / b[k] for k in sorted(set(a) & set(b))
            if math.isfinite(a[k]) and math.isfinite(b[k]) and b[k] != 0]
  return dataclasses.replace(mean_interval(ratios, level), method="paired t (ratios)")


def format_interval(iv: Interval, digits: int = 1, signed: bool = False) -> str:
  """`62.3 [58.1, 66.5]`; `62.3 (n=1)` without an interval; `—` without values."""
  if not math.isfinite(iv.mean):
    return "—"
  spec = f"{'+' if signed else ''},.{digits}f"
  if not (math.isfinite(iv.low) and math.isfinite(iv.high)):
    return f"{iv.mean:{spec}} (n={iv.n})"
  return f"{iv.mean:{spec}} [{iv.low:,.{digits}f}, {iv.high:,.{digits}f}]"
