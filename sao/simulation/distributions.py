"""Random durations and counts for the fleet simulator, each a small frozen description that samples itself.

  constant   always `a`.
  lognormal  median `a`, log-space standard deviation `b`: exp(N(ln a, b²)). Heavy right tail for b ≳ 1.
  pareto     `a · X` with X ~ Pareto(α = `b`) on [1, ∞), as `slow_number_search` draws its episode delay (numpy's
             `a * (1 + rng.pareto(b))`); infinite variance for α <= 2.
  choice     uniformly one of `values` (an empirical distribution, e.g. measured trainer step times).
  cycle      `values` in order, over and over (a replayed trace; hand-computable cases). The position lives in the
             object: one simulated run per `Distribution("cycle", ...)` object.

Every kind is then clipped to [`lo`, `hi`]. `mean()` is exact for constant and choice, and for the clipped Pareto
(the bench's delay); the others use a fixed-seed Monte-Carlo estimate (200,000 draws).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

KINDS = ("constant", "lognormal", "pareto", "choice", "cycle")


@dataclasses.dataclass(frozen=True)
class Distribution:
  """See the module docstring for what `a` and `b` mean per `kind`."""
  kind: str
  a: float = 0.0
  b: float = 0.0
  lo: float = 0.0
  hi: float = math.inf
  values: tuple[float, ...] = ()
  _position: list[int] = dataclasses.field(default_factory=lambda: [0], compare=False, repr=False)

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"Distribution.kind must be one of {KINDS}, got {self.kind!r}")
    if self.lo > self.hi:
      raise ValueError(f"Distribution: lo {self.lo} > hi {self.hi}")
    if self.kind in ("choice", "cycle"):
      if not self.values or not all(math.isfinite(v) for v in self.values):
        raise ValueError(f"Distribution('choice') needs finite values, got {self.values!r}")
    elif self.kind == "constant":
      if not math.isfinite(self.a):
        raise ValueError(f"Distribution('constant'): a must be finite, got {self.a}")
    elif not (self.a > 0 and self.b > 0):
      raise ValueError(f"Distribution({self.kind!r}): a (median/scale) and b (sigma/alpha) must be > 0, got "
                       f"{self.a}, {self.b}")

  def sample(self, rng: np.random.Generator, size: int | None = None) -> float | np.ndarray:
    """One draw (`size` None) or an array of `size` draws, clipped to [lo, hi]."""
    if size is None:  # the simulator's common case: plain floats, no arrays
      if self.kind == "constant":
        x = self.a
      elif self.kind == "lognormal":
        x = self.a * math.exp(self.b * rng.standard_normal())
      elif self.kind == "pareto":
        x = self.a * (1.0 + rng.pareto(self.b))
      elif self.kind == "cycle":
        x = self._next(1)[0]
      else:
        x = self.values[int(rng.integers(0, len(self.values)))]
      return float(min(max(x, self.lo), self.hi))
    n = size
    if self.kind == "constant":
      x = np.full(n, self.a)
    elif self.kind == "lognormal":
      x = self.a * np.exp(self.b * rng.standard_normal(n))
    elif self.kind == "pareto":
      x = self.a * (1.0 + rng.pareto(self.b, n))
    elif self.kind == "cycle":
      x = np.asarray(self._next(n), dtype=float)
    else:
      x = np.asarray(self.values, dtype=float)[rng.integers(0, len(self.values), n)]
    return np.clip(x, self.lo, self.hi)

  def _next(self, n: int) -> list[float]:
    start = self._position[0]
    self._position[0] = start + n
    return [self.values[(start + i) % len(self.values)] for i in range(n)]

  def mean(self) -> float:
    """E[clip(X, lo, hi)] (module docstring: exact or a fixed-seed estimate)."""
    if self.kind == "constant":
      return float(np.clip(self.a, self.lo, self.hi))
    if self.kind in ("choice", "cycle"):
      return float(np.mean(np.clip(self.values, self.lo, self.hi)))
    if self.kind == "pareto" and self.lo <= self.a:
      return _clipped_pareto_mean(self.a, self.b, self.hi)
    return float(np.mean(self.sample(np.random.default_rng(0), 200_000)))


def _clipped_pareto_mean(scale: float, alpha: float, hi: float) -> float:
  """E[min(scale·X, hi)], X ~ Pareto(alpha) on [1, ∞): scale·(1 + ∫₁^c x^−α dx) with c = hi / scale."""
  if hi <= scale:
    return float(hi)
  c = hi / scale
  tail = math.log(c) if alpha == 1.0 else (1.0 - c ** (1.0 - alpha)) / (alpha - 1.0)
  return scale * (1.0 + tail)


def parse(spec: str) -> Distribution:
  """A distribution from a flag-friendly string: `constant:5`, `lognormal:5,0.8`, `lognormal:40,0.5,1,100`
  (median, sigma, lo, hi), `pareto:2,1.5,,20` (scale, alpha, lo, hi; an empty field keeps its default),
  `choice:1.2,1.4,1.3`."""
  kind, _, rest = spec.partition(":")
  fields = [f.strip() for f in rest.split(",")] if rest else []
  try:
    if kind in ("choice", "cycle"):
      return Distribution(kind, values=tuple(float(f) for f in fields))
    names = ("a", "b", "lo", "hi") if kind != "constant" else ("a", "lo", "hi")
    if len(fields) > len(names):
      raise ValueError(f"at most {len(names)} fields ({', '.join(names)})")
    return Distribution(kind, **{n: float(f) for n, f in zip(names, fields) if f})
  except ValueError as e:
    raise ValueError(f"distribution {spec!r}: {e}") from e
