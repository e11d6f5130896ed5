"""What one simulated run measured (`FleetReport`) and its one-line and dict forms."""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class FleetReport:
  """Counts are samples (trajectories); times are simulated seconds unless named `_per_hour`.

  Every dispatched sample is in exactly one place at the end (`unaccounted()` is 0):
    dispatched = running + awaiting_ack + stale_rejected + lost + accepted
    accepted   = buffered + in_learner + trained + dropped_stale
  running: in its episode; awaiting_ack: finished, pushed back (BACKPRESSURE) and retried; stale_rejected: refused
  at admission (STALE_POLICY); lost: its lease had lapsed (UNKNOWN_LEASE); buffered: accepted, not yet taken
  (`GroupBuffer.held`); in_learner: taken by the step still training at the end; trained: taken and fresh;
  dropped_stale: taken but older than `max_staleness` at the step that took it (the trainer's filter).
  """
  loops: int
  group_size: int
  batch_size: int
  sim_s: float
  steps: int
  dispatched: int = 0
  running: int = 0
  awaiting_ack: int = 0
  stale_rejected: int = 0
  lost: int = 0
  accepted: int = 0
  buffered: int = 0
  in_learner: int = 0
  trained: int = 0
  dropped_stale: int = 0
  staleness: dict[int, int] = dataclasses.field(default_factory=dict)  # taken after warm-up: staleness → count
  # The same for the trajectories leased after the first measured step began (the steady state: no episode that
  # ran during the warm-up steps).
  staleness_steady: dict[int, int] = dataclasses.field(default_factory=dict)
  measured_steps: int = 0
  measured_s: float = 0.0  # from the first measured step's wait to the end of the last training (bench's wall)
  measured_from_s: float = 0.0  # when the first measured step began waiting for its batch
  waiting_s: float = 0.0  # the trainer's waits for a batch within `measured_s`
  episode_s: float = 0.0  # loop-seconds of every finished episode
  discarded_s: float = 0.0  # loop-seconds of episodes rejected or dropped as stale
  loop_busy_s: float = 0.0  # loop-seconds in an episode (running)
  loop_blocked_s: float = 0.0  # loop-seconds holding a finished trajectory the trainer pushed back
  time_to_target_s: float | None = None
  unloaded_episode_s: float = 0.0  # E[episode time] with idle engines (the linear-scaling assumption's input)
  final_version: int = 0

  @property
  def traj_per_hour(self) -> float:
    """Trajectories taken by the measured steps per hour (the bench's throughput, stale-dropped included)."""
    return 3600.0 * self.measured_steps * self.batch_size / self.measured_s if self.measured_s else 0.0

  @property
  def trained_per_hour(self) -> float:
    """Trajectories trained on (fresh) per simulated hour over the whole run."""
    return 3600.0 * self.trained / self.sim_s if self.sim_s else 0.0

  @property
  def linear_per_hour(self) -> float:
    """What linear concurrency scaling assumes: every loop busy, episodes at idle-engine speed."""
    return 3600.0 * self.loops / self.unloaded_episode_s if self.unloaded_episode_s else 0.0

  @property
  def busy(self) -> float:
    """The trainer's busy fraction over the measured steps, 1 − waiting / wall (as `bench_pipeline.py`)."""
    return 1.0 - self.waiting_s / self.measured_s if self.measured_s else 0.0

  @property
  def staleness_mean(self) -> float:
    return _mean(self.staleness)

  @property
  def staleness_steady_mean(self) -> float:
    return _mean(self.staleness_steady)

  def staleness_quantile(self, q: float) -> int:
    """The smallest staleness s with P(staleness <= s) >= q over the measured steps' trajectories."""
    n, seen = sum(self.staleness.values()), 0
    for s in sorted(self.staleness):
      seen += self.staleness[s]
      if seen >= q * n:
        return s
    return 0

  @property
  def discarded_fraction(self) -> float:
    """Share of finished episodes' loop-seconds thrown away as stale (at admission or by the trainer)."""
    return self.discarded_s / self.episode_s if self.episode_s else 0.0

  @property
  def loop_utilisation(self) -> float:
    return self.loop_busy_s / (self.loops * self.sim_s) if self.sim_s else 0.0

  def unaccounted(self) -> int:
    """0 when every dispatched sample is in exactly one place (the class docstring's two balances)."""
    a = self.dispatched - (self.running + self.awaiting_ack + self.stale_rejected + self.lost + self.accepted)
    b = self.accepted - (self.buffered + self.in_learner + self.trained + self.dropped_stale)
    return abs(a) + abs(b)

  def summary(self) -> dict[str, Any]:
    """The headline numbers, JSON-serialisable."""
    return {"loops": self.loops, "group_size": self.group_size, "batch_size": self.batch_size,
            "sim_hours": self.sim_s / 3600, "steps": self.steps, "traj_per_hour": self.traj_per_hour,
            "trained_per_hour": self.trained_per_hour, "linear_per_hour": self.linear_per_hour,
            "busy": self.busy, "staleness_mean": self.staleness_mean, "staleness_p50": self.staleness_quantile(0.5),
            "staleness_p99": self.staleness_quantile(0.99), "staleness": {str(k): v for k, v in
                                                                           sorted(self.staleness.items())},
            "stale_rejected": self.stale_rejected, "dropped_stale": self.dropped_stale,
            "discarded_fraction": self.discarded_fraction, "loop_utilisation": self.loop_utilisation,
            "loop_blocked": self.loop_blocked_s / (self.loops * self.sim_s) if self.sim_s else 0.0,
            "time_to_target_h": None if self.time_to_target_s is None else self.time_to_target_s / 3600,
            "trained": self.trained, "dispatched": self.dispatched, "final_version": self.final_version}


def _mean(histogram: dict[int, int]) -> float:
  n = sum(histogram.values())
  return sum(s * c for s, c in histogram.items()) / n if n else 0.0
