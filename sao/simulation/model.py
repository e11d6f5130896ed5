"""What the fleet simulator simulates: the agent loops' episodes, the engines' capacity, the trainer, the service knobs.

An episode (one sample of a lease) is a setup (container start, repository checkout) followed by `turns` turns, each
a generation on the engines and a tool call. The engines serve `engine_slots` concurrent generations at full speed;
beyond that every generation slows in proportion (processor sharing). The number generating at a moment is
estimated as (loops in their turns) × (the share of a turn spent generating, from the distributions' means), and a
turn's slowdown max(1, generating / engine_slots) is taken when the turn starts (the first turn) or, for the rest of
the episode, when the first turn ends: a mean-field model, not a token-level one. The trajectory's policy version is
the engines' version when its first turn ends (`sao.rollout.agent` records the minimum over turns). The engines may
also stall (`sao.simulation.stalls`: compilations, CUDA-graph captures): every generation in flight then waits, and
so does every new one, until the stall ends; and they may serve more slowly while the trainer computes
(`trainer_contention`, `sao.simulation.contention`: one machine's processors shared by the engine and the trainer).

The trainer takes `batch_size` trajectories when the buffer holds them, trains for `step_s`, and publishes a new
version (`publish_s`) after every update past `actor_warmup_steps` (SAO's critic warm-up updates leave the actor,
hence the version, unchanged).
"""
from __future__ import annotations

import dataclasses
import math

from sao.simulation.distributions import Distribution
from sao.simulation.stalls import StallModel


@dataclasses.dataclass(frozen=True)
class EpisodeModel:
  """Durations (seconds) and turn counts of one episode (module docstring). `turns` is rounded, at least 1."""
  setup_s: Distribution
  turns: Distribution
  gen_s: Distribution
  tool_s: Distribution

  @property
  def gen_share(self) -> float:
    """The share of a turn spent generating, E[gen] / (E[gen] + E[tool])."""
    gen, tool = self.gen_s.mean(), self.tool_s.mean()
    return gen / (gen + tool) if gen + tool > 0 else 0.0

  def mean_unloaded_s(self) -> float:
    """E[episode time] with idle engines: E[setup] + E[turns]·(E[gen] + E[tool]) (turns independent of the rest)."""
    return self.setup_s.mean() + max(1.0, self.turns.mean()) * (self.gen_s.mean() + self.tool_s.mean())


@dataclasses.dataclass(frozen=True)
class FleetConfig:
  """One simulated fleet.

  Attributes:
    loops: agent loops (episode slots); a slot is held from lease to the trainer's acknowledgement, as the rollout
      worker holds it.
    group_size: rollouts per task (1: SAO; G: GSPO/GRPO, whose group is trained only when all G are in).
    batch_size: trajectories per learner step (a multiple of `group_size`).
    episode: the episode model; engine_slots: concurrent generations at full speed (0 = unlimited).
    stalls: when the engines serve nothing (`StallModel`; the default: never).
    trainer_contention: while the trainer computes (a step, from its take to its end), a turn's engine seconds
      take this many times as long (`sao.simulation.contention`: the local engine shares the trainer's processors).
      1 (the default): the engines run at one speed, as a GPU fleet's do.
    submit_latency_s: from an episode's end to its submission reaching the trainer (the loop stays held).
    step_s: the trainer's time per step (take to next take, publishing included); publish_s: weights to the
      engines after an update, on top of step_s (0 when step_s includes it).
    publish_fraction: where in a step the new version lands on the server, which counts staleness against it and
      admits by it (1: at its end; the rest of the step is bookkeeping: metrics, the consumed ledger).
    engine_publish_fraction: where in a step the engines start serving (and stamping trajectories with) the new
      version; the trainer's publish call returns after they swapped, so it is <= `publish_fraction`. None: with
      the server.
    actor_warmup_steps: first updates that leave the policy version unchanged (SAO's `critic_warmup_steps`).
    max_staleness, max_outstanding, buffer_capacity, lease_ttl_s: the server's and dispenser's knobs
      (`ServerConfig`, `DispenserConfig`); max_outstanding 0 = no flow control.
    backpressure_retry_s, no_work_retry_s: the retry hints a worker waits after a refused lease or submission.
    num_tasks: training tasks in the dispenser (epochs repeat).
    seed: all randomness (episode times, step times, the dispenser's shuffle).
    target_trajectories: stop once this many were trained on; max_hours: or at this simulated time;
    max_steps: or after this many learner steps (0 = no limit).
    warmup_steps: learner steps left out of the busy fraction and throughput (the bench's JIT warm-up).
    warmup_step_s: the first steps' training times, when they differ from `step_s` (the bench's compilations).
  """
  loops: int
  episode: EpisodeModel
  step_s: Distribution
  group_size: int = 1
  batch_size: int = 64
  engine_slots: int = 0
  stalls: StallModel = StallModel()
  trainer_contention: float = 1.0
  submit_latency_s: float = 0.0
  publish_s: float = 0.0
  publish_fraction: float = 1.0
  engine_publish_fraction: float | None = None
  actor_warmup_steps: int = 0
  max_staleness: int = 8
  max_outstanding: int = 128
  buffer_capacity: int = 512
  lease_ttl_s: float = 7200.0
  backpressure_retry_s: float = 0.2
  no_work_retry_s: float = 1.0
  num_tasks: int = 10_000
  seed: int = 0
  target_trajectories: int = 0
  max_hours: float = 24.0
  max_steps: int = 0
  warmup_steps: int = 0
  warmup_step_s: tuple[float, ...] = ()

  def __post_init__(self):
    for name in ("loops", "group_size", "batch_size", "buffer_capacity", "num_tasks"):
      if getattr(self, name) < 1:
        raise ValueError(f"FleetConfig.{name} must be >= 1, got {getattr(self, name)}")
    for name in ("engine_slots", "actor_warmup_steps", "max_staleness", "max_outstanding", "target_trajectories",
                 "max_steps", "warmup_steps"):
      if getattr(self, name) < 0:
        raise ValueError(f"FleetConfig.{name} must be >= 0, got {getattr(self, name)}")
    if self.batch_size % self.group_size:
      raise ValueError(f"FleetConfig.batch_size {self.batch_size} is not a multiple of group_size {self.group_size}")
    if self.loops < self.group_size:
      raise ValueError(f"FleetConfig.loops {self.loops} < group_size {self.group_size}: no group could ever run")
    if self.buffer_capacity < self.batch_size:
      raise ValueError(f"FleetConfig.buffer_capacity {self.buffer_capacity} < batch_size {self.batch_size}: the "
                       "trainer could never take a batch")
    if self.max_outstanding and self.max_outstanding < self.batch_size:
      raise ValueError(f"FleetConfig.max_outstanding {self.max_outstanding} < batch_size {self.batch_size}: the "
                       "trainer could never take a batch")
    for name in ("publish_s", "submit_latency_s", "backpressure_retry_s", "no_work_retry_s"):
      if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
        raise ValueError(f"FleetConfig.{name} must be finite and >= 0, got {getattr(self, name)}")
    if not (self.lease_ttl_s > 0 and self.max_hours > 0):
      raise ValueError(f"FleetConfig.lease_ttl_s and max_hours must be > 0, got {self.lease_ttl_s}, "
                       f"{self.max_hours}")
    if not (math.isfinite(self.trainer_contention) and self.trainer_contention > 0):
      raise ValueError(f"FleetConfig.trainer_contention must be finite and > 0 (1: none), got "
                       f"{self.trainer_contention}")
    if not 0.0 <= self.publish_fraction <= 1.0:
      raise ValueError(f"FleetConfig.publish_fraction must lie in [0, 1], got {self.publish_fraction}")
    if self.engine_publish_fraction is not None and not 0.0 <= self.engine_publish_fraction <= self.publish_fraction:
      raise ValueError(f"FleetConfig.engine_publish_fraction must lie in [0, publish_fraction = "
                       f"{self.publish_fraction}], got {self.engine_publish_fraction}")
    if not all(math.isfinite(t) and t >= 0 for t in self.warmup_step_s):
      raise ValueError(f"FleetConfig.warmup_step_s must be finite and >= 0, got {self.warmup_step_s}")
    if not (self.target_trajectories or self.max_steps or math.isfinite(self.max_hours)):
      raise ValueError("FleetConfig: give target_trajectories, max_steps or a finite max_hours")
