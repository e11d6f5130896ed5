"""A staleness bound that follows the measured trainer/engine mismatch: `max_outstanding` shrinks when the learner's
per-batch log-prob mismatch is high and grows back when it is calm (AIMD, as TCP's congestion window).

`max_outstanding` (`sao.transport.flow.lease_allowance`) bounds the samples leased or buffered at once, hence how
far rollouts run ahead of the learner (their staleness). The controller reads one number per learner update, the
signal (default `actor/logprob_mismatch`, the learner's mean |log π_θ − log π_rollout| over the batch's action tokens,
`sao.train.steps`; `actor/mismatch_kl_k3` works too), and sets the allowance `M`:

    signal > high:                         M ← max(floor, ⌊shrink · M⌋)           (multiplicative decrease)
    signal < low for `calm_updates` in a row: M ← min(base, M + grow)             (additive increase)
    otherwise (between low and high, or no signal — a critic-only update): M stays

with `base` the configured `server.max_outstanding`, `floor = max(min_outstanding, batch_size)` (below one batch the
learner could never collect a batch) and every value a multiple of the group size. Throughput cost, reported each
update: the allowance `M` and `M/base`, and `withheld_sample_updates = Σ_updates (base − M)`, the lease capacity the
bound took away, summed over updates; the trainer's own idle time waiting for rollouts is the progress row's `wait`.

Pure bookkeeping: no locks, no clock. The trainer (process 0, which owns the server) feeds it after each update and
hands the allowance to `TrajectoryServer.set_max_outstanding`; the learner's programs never depend on it, so the
processes of a multi-process trainer need not agree on it. Not checkpointed: a resumed run starts from `base`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

PREFIX = "staleness_control/"


@dataclasses.dataclass(frozen=True)
class AdaptiveStalenessConfig:
  """The controller's knobs (the run config's `server.adaptive_staleness`; see the module docstring)."""
  enabled: bool = False
  signal: str = "actor/logprob_mismatch"
  high: float = 0.03
  low: float = 0.01
  shrink: float = 0.5
  grow: int = 0  # samples added per calm stretch; 0 = one batch
  calm_updates: int = 3
  min_outstanding: int = 0  # 0 = one batch

  def __post_init__(self):
    if not 0.0 <= self.low < self.high:
      raise ValueError(f"adaptive_staleness: need 0 <= low < high, got low={self.low}, high={self.high}")
    if not 0.0 < self.shrink < 1.0:
      raise ValueError(f"adaptive_staleness: shrink must be in (0, 1), got {self.shrink}")
    for name in ("grow", "min_outstanding"):
      if getattr(self, name) < 0:
        raise ValueError(f"adaptive_staleness: {name} must be >= 0, got {getattr(self, name)}")
    if self.calm_updates < 1:
      raise ValueError(f"adaptive_staleness: calm_updates must be >= 1, got {self.calm_updates}")
    if not self.signal:
      raise ValueError("adaptive_staleness: signal must name a learner metric")


class StalenessController:
  """The AIMD controller of `max_outstanding` (module docstring).

  Args:
    config: the knobs.
    base: the configured `max_outstanding` (> 0: flow control must be on), the ceiling.
    batch_size: trajectories per learner batch (the floor's default and the default growth).
    group_size: samples per task; every allowance is a multiple of it.
  """

  def __init__(self, config: AdaptiveStalenessConfig, base: int, batch_size: int, group_size: int = 1):
    if base <= 0:
      raise ValueError("adaptive_staleness needs flow control: server.max_outstanding must be > 0")
    if batch_size <= 0 or group_size <= 0:
      raise ValueError(f"adaptive_staleness: batch_size and group_size must be > 0, got {batch_size}, {group_size}")
    self.config = config
    self.group_size = group_size
    self.base = self._to_group(base)
    self.floor = min(self.base, self._to_group(max(config.min_outstanding, batch_size), up=True))
    self.grow = self._to_group(config.grow or batch_size, up=True)
    self.allowance = self.base
    self.calm = 0
    self.shrinks = 0
    self.grows = 0
    self.withheld = 0

  def _to_group(self, samples: int, up: bool = False) -> int:
    whole = -(-samples // self.group_size) if up else samples // self.group_size
    return max(whole, 1) * self.group_size

  def observe(self, signal: float | None) -> int:
    """Takes one update's signal (None or non-finite: no measurement, the allowance holds) and returns the new
    allowance."""
    c = self.config
    if signal is not None and math.isfinite(signal):
      if signal > c.high:
        shrunk = max(self.floor, self._to_group(int(self.allowance * c.shrink)))
        self.shrinks += shrunk < self.allowance  # counts the bound's moves, not the updates above `high`
        self.allowance, self.calm = shrunk, 0
      elif signal < c.low:
        self.calm += 1
        if self.calm >= c.calm_updates and self.allowance < self.base:
          self.allowance = min(self.base, self.allowance + self.grow)
          self.calm = 0
          self.grows += 1
      else:
        self.calm = 0
    self.withheld += self.base - self.allowance
    return self.allowance

  def step(self, metrics: Mapping[str, float], server_stats: Mapping[str, Any] | None = None) -> dict[str, float]:
    """`observe(metrics[signal])` and the controller's metrics (prefix `staleness_control/`), with the server's
    count of lease calls the bound refused so far (`TrajectoryServer.stats()["lease_throttled"]`) when given."""
    signal = metrics.get(self.config.signal)
    self.observe(None if signal is None else float(signal))
    out = {f"{PREFIX}max_outstanding": float(self.allowance),
           f"{PREFIX}allowance_fraction": self.allowance / self.base,
           f"{PREFIX}withheld_sample_updates": float(self.withheld),
           f"{PREFIX}shrinks": float(self.shrinks), f"{PREFIX}grows": float(self.grows)}
    if server_stats is not None:
      out[f"{PREFIX}lease_calls_throttled"] = float(server_stats.get("lease_throttled", 0))
    return out


def from_run_config(settings: Mapping[str, Any] | None, base: int, batch_size: int,
                    group_size: int) -> StalenessController | None:
  """The controller the run config's `server.adaptive_staleness` asks for, or None (absent or not enabled)."""
  if not settings or not settings.get("enabled"):
    return None
  return StalenessController(AdaptiveStalenessConfig(**dict(settings)), base, batch_size, group_size)
