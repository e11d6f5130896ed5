"""The fleet simulator's event loop: agent loops, engines and the trainer under a simulated clock.

The service side is the project's own code, called as the gRPC server calls it: `TaskDispenser` (leases, expiry,
re-leases, groups; its clock is the simulated one), `GroupBuffer` (the bounded buffer with group reservations) and
`sao.transport.flow` (`outstanding_samples` and `lease_allowance` under `max_outstanding`, `admit` with the
staleness bound and backpressure, `accept`, and the trainer's `is_fresh` filter). No socket, thread or sleep: events
are popped from a heap in time order (ties in the order they were scheduled), so a run is a function of its
`FleetConfig` (seed included). Engine stalls (`FleetConfig.stalls`) move the end of every generation they meet
(`StallSchedule.finish`); without them the event times are what they were before stalls existed, to the bit. With
`FleetConfig.trainer_contention` != 1 the engines also serve more slowly while the trainer computes
(`sao.simulation.contention.EngineClock`): every step taken moves the end of the generations in flight, so their
events carry a token and a superseded one is ignored; with 1 (the default) the run is what it was without it.

The worker side follows `sao.rollout.worker` (which this package cannot import): a loop's slot is held from the
lease until the trainer acknowledges the sample (accepted or rejected), a pushed-back sample is re-sent after
`backpressure_retry_s` (here: at the first retry tick after the trainer took a batch or published, when room or a
new version can change the answer), an empty lease answer is retried after the server's hint, and running leases
are heartbeated (every lease_ttl_s / 3, enough that a running lease never lapses). One difference, on purpose: the
worker asks for `free // group_size` tasks, so `loops` bounds the episodes in flight also in group mode (the real
worker asks for `free` tasks of G samples each; see docs/fleet_simulation.md).
"""
from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import math

import numpy as np

from sao.simulation.contention import EngineClock
from sao.simulation.model import FleetConfig
from sao.simulation.report import FleetReport
from sao.simulation.stalls import StallSchedule
from sao.transport import flow
from sao.transport.dispenser import TaskDispenser
from sao.transport.group_buffer import GroupBuffer
from sao.transport.leases import DispenserConfig, Lease
from sao.transport.trajectory import ReasonCode, Trajectory, TrajectoryError

_WORKER = "sim-worker"
_EMPTY = np.zeros(1, np.int32)


@dataclasses.dataclass(eq=False)
class _Episode:
  lease: Lease
  sample_index: int
  start: float
  turns: int
  version: int = 0
  end: float = 0.0
  traj: Trajectory | None = None
  # With trainer contention: the engine phase in flight (its start, engine seconds and tool seconds per turn), when
  # it is due, the event kind that ends it, and the token of its live event (an older one is superseded).
  phase_start: float = 0.0
  phase_engine_s: tuple[float, ...] = ()
  phase_tool_s: tuple[float, ...] = ()
  due: float = 0.0
  due_kind: str = ""
  token: int = 0


class FleetSimulator:
  """One run: `FleetSimulator(config).run()` → `FleetReport`."""

  def __init__(self, config: FleetConfig):
    c = self.config = config
    self.now = 0.0
    self._rng = np.random.default_rng(c.seed)
    self._stalls = StallSchedule(c.stalls, c.seed) if c.stalls.active else None
    self._clock = EngineClock(self._stalls, c.trainer_contention) if c.trainer_contention != 1.0 else None
    self._in_engine: dict[_Episode, None] = {}  # with the clock: episodes in their turns, in start order
    tasks = [{"id": f"t{i}"} for i in range(c.num_tasks)]
    self.dispenser = TaskDispenser(tasks, DispenserConfig(
        mode="sao" if c.group_size == 1 else "group", group_size=c.group_size, seed=c.seed,
        lease_ttl_s=c.lease_ttl_s), clock=lambda: self.now)
    self.buffer = GroupBuffer(c.buffer_capacity)
    self.version = 0  # the learner's = the server's once published
    self.engine_version = 0  # what the engines serve: the new version reaches them first (engine_publish_fraction)
    self._events: list = []
    self._seq = itertools.count()
    self._slots = 0  # samples leased and not yet acknowledged (the worker's held slots)
    self._running: collections.Counter[str] = collections.Counter()  # lease id → samples still heartbeated
    self._turning = 0  # loops past their setup, in their turns (for the engines' load)
    self._blocked: collections.deque[_Episode] = collections.deque()
    self._poll_at = math.inf  # the worker's next scheduled lease call
    self._retry_at = math.inf  # the next re-send of pushed-back samples
    self._training = False
    self._wait_start = 0.0
    self._updates = 0
    self._last_area_t = 0.0
    self._gen_share = c.episode.gen_share
    self.report = FleetReport(c.loops, c.group_size, c.batch_size, 0.0, 0,
                              unloaded_episode_s=c.episode.mean_unloaded_s())
    self._measure_start: float | None = None
    self._batch_fresh = 0
    self._takes = 0

  # ------------------------------------------------------------------------------------------------ the loop
  def _at(self, t: float, kind: str, payload=None) -> None:
    heapq.heappush(self._events, (t, next(self._seq), kind, payload))

  def _advance(self, t: float) -> None:
    """Moves the clock, integrating the loops' busy and blocked time."""
    dt = t - self._last_area_t
    r = self.report
    r.loop_busy_s += dt * (self._slots - len(self._blocked))
    r.loop_blocked_s += dt * len(self._blocked)
    self._last_area_t = self.now = t

  def run(self) -> FleetReport:
    c = self.config
    horizon = c.max_hours * 3600.0
    self._at(0.0, "poll")
    self._at(c.lease_ttl_s / 3, "heartbeat")
    handlers = {"poll": self._poll, "setup_done": self._setup_done, "first_turn": self._first_turn,
                "end": self._end, "submit": self._first_submit, "retry": self._retry, "train_end": self._train_end,
                "publish_end": self._publish_end, "step_done": self._step_done, "heartbeat": self._heartbeat,
                "engines": self._engines_updated, "phase_done": self._phase_done}
    while self._events and not self._done():
      t, _, kind, payload = heapq.heappop(self._events)
      if t > horizon:
        self._advance(horizon)
        break
      self._advance(t)
      handlers[kind](payload)
    return self._finish()

  def _done(self) -> bool:
    c, r = self.config, self.report
    return bool((c.target_trajectories and r.trained >= c.target_trajectories)
                or (c.max_steps and r.steps >= c.max_steps and not self._training))

  def _finish(self) -> FleetReport:
    r = self.report
    r.sim_s = self.now
    r.final_version = self.version
    r.buffered = self.buffer.held
    r.awaiting_ack = len(self._blocked)
    r.running = self._slots - len(self._blocked)
    r.measured_from_s = self._measure_start or 0.0
    return r

  # ------------------------------------------------------------------------------------------------ worker side
  def _poll(self, _=None) -> None:
    """The worker's lease call for its free slots (`flow.lease_allowance` under max_outstanding)."""
    c = self.config
    if self._poll_at <= self.now:
      self._poll_at = math.inf
    while True:
      wanted = (c.loops - self._slots) // c.group_size
      if wanted <= 0:
        return  # an acknowledgement frees a slot and polls again
      outstanding = flow.outstanding_samples(self.dispenser, self.buffer)
      allowed = flow.lease_allowance(wanted, c.max_outstanding, outstanding, c.group_size)
      if allowed <= 0:
        return self._schedule_poll(c.backpressure_retry_s)
      leases = self.dispenser.lease(_WORKER, allowed)
      if not leases:
        return self._schedule_poll(c.no_work_retry_s)
      for lease in leases:
        self._running[lease.lease_id] += len(lease.sample_indices)
        for index in lease.sample_indices:
          self._start(lease, index)

  def _schedule_poll(self, delay: float) -> None:
    if self._poll_at > self.now + delay:
      self._poll_at = self.now + delay
      self._at(self._poll_at, "poll")

  def _start(self, lease: Lease, sample_index: int) -> None:
    e = self.config.episode
    self._slots += 1
    self.report.dispatched += 1
    turns = max(1, int(round(e.turns.sample(self._rng))))
    episode = _Episode(lease, sample_index, self.now, turns)
    self._at(self.now + e.setup_s.sample(self._rng), "setup_done", episode)

  def _slowdown(self) -> float:
    slots = self.config.engine_slots
    return max(1.0, self._turning * self._gen_share / slots) if slots else 1.0

  def _setup_done(self, episode: _Episode) -> None:
    self._turning += 1
    gen = self.config.episode.gen_s.sample(self._rng) * self._slowdown()
    if self._clock is not None:
      return self._engine_phase(episode, "first_turn", self.now, (gen,), (0.0,))
    self._at(self.now + gen if self._stalls is None else self._stalls.finish(self.now, gen), "first_turn", episode)

  def _first_turn(self, episode: _Episode) -> None:
    e = self.config.episode
    episode.version = self.engine_version  # the engines' version now: the minimum over the episode's turns
    first_tool = e.tool_s.sample(self._rng)
    rest = first_tool
    if episode.turns > 1:
      n = episode.turns - 1
      gens, tools = e.gen_s.sample(self._rng, n), e.tool_s.sample(self._rng, n)
      slowdown = self._slowdown()
      if self._clock is not None:
        return self._engine_phase(episode, "end", self.now + first_tool, tuple(gens * slowdown), tuple(tools))
      rest += float(np.sum(gens) * slowdown + np.sum(tools))
      if self._stalls is not None and self._stalls.overlaps(self.now, self.now + rest):
        # Turn by turn: each generation waits out the stalls it meets, the tool calls run on through them.
        self._at(self._stalls.run(self.now + first_tool, gens * slowdown, tools), "end", episode)
        return
    self._at(self.now + rest, "end", episode)

  def _engine_phase(self, episode: _Episode, kind: str, start: float, engine_s: tuple[float, ...],
                    tool_s: tuple[float, ...]) -> None:
    """With the engine clock: turns that start at `start` (engine seconds, then tool seconds, each) end the
    `kind` stage ("first_turn" or "end") when the clock says; a step taken meanwhile recomputes it."""
    episode.phase_start, episode.phase_engine_s, episode.phase_tool_s = start, engine_s, tool_s
    episode.due_kind = kind
    self._in_engine[episode] = None
    self._schedule_phase(episode, self._clock.run(start, engine_s, tool_s))

  def _schedule_phase(self, episode: _Episode, due: float) -> None:
    episode.due = due
    episode.token += 1
    self._at(due, "phase_done", (episode, episode.token))

  def _phase_done(self, payload: tuple[_Episode, int]) -> None:
    episode, token = payload
    if token != episode.token:
      return  # superseded: a step taken since moved this phase's end
    del self._in_engine[episode]
    (self._first_turn if episode.due_kind == "first_turn" else self._end)(episode)

  def _trainer_busy(self, duration_s: float) -> None:
    """The trainer computes from now for `duration_s`: the generations in flight are recomputed from their start
    (the clock before now is unchanged)."""
    self._clock.add_busy(self.now, self.now + duration_s)
    for episode in self._in_engine:
      due = self._clock.run(episode.phase_start, episode.phase_engine_s, episode.phase_tool_s)
      if due != episode.due:
        self._schedule_phase(episode, due)

  def _end(self, episode: _Episode) -> None:
    self._turning -= 1
    episode.end = self.now
    self.report.episode_s += episode.end - episode.start
    episode.traj = Trajectory(task_id=episode.lease.task_id, token_ids=_EMPTY, action_mask=_EMPTY.astype(bool),
                              rollout_logprobs=_EMPTY.astype(np.float32), reward=0.0, policy_version=episode.version,
                              sample_index=episode.sample_index, group_id=episode.lease.group_id,
                              num_turns=episode.turns, lease_id=episode.lease.lease_id,
                              metrics={"episode_s": episode.end - episode.start, "leased_at": episode.start})
    if self.config.submit_latency_s:
      self._at(self.now + self.config.submit_latency_s, "submit", episode)
    else:
      self._first_submit(episode)

  def _first_submit(self, episode: _Episode) -> None:
    if not self._submit(episode):
      self._blocked.append(episode)

  def _submit(self, episode: _Episode) -> bool:
    """One submission through `flow.admit` / `flow.accept`; False when pushed back (the caller keeps it blocked)."""
    r = self.report
    try:
      lease = flow.admit(self.dispenser, self.buffer, episode.traj, _WORKER, self.version, self.config.max_staleness)
    except TrajectoryError as err:
      if err.reason_code == ReasonCode.BACKPRESSURE:
        return False
      if err.reason_code == ReasonCode.STALE_POLICY:
        r.stale_rejected += 1
        r.discarded_s += episode.end - episode.start
      elif err.reason_code == ReasonCode.UNKNOWN_LEASE:
        r.lost += 1
      else:
        raise
    else:
      flow.accept(self.dispenser, self.buffer, lease, episode.traj)
      r.accepted += 1
    self._acknowledged(episode)
    if not self._training:
      self._take()
    return True

  def _acknowledged(self, episode: _Episode) -> None:
    """The worker frees the slot and stops heartbeating the sample; a free slot means another lease call."""
    lease_id = episode.lease.lease_id
    self._running[lease_id] -= 1
    if self._running[lease_id] <= 0:
      del self._running[lease_id]
    self._slots -= 1
    self._poll()

  def _schedule_retry(self) -> None:
    if self._blocked and self._retry_at > self.now + self.config.backpressure_retry_s:
      self._retry_at = self.now + self.config.backpressure_retry_s
      self._at(self._retry_at, "retry")

  def _retry(self, _=None) -> None:
    self._retry_at = math.inf
    blocked, self._blocked = self._blocked, collections.deque()
    full_at = None  # (takes, version) when a submission was last pushed back in this pass
    for episode in blocked:
      # Skipped when the answer is known to be BACKPRESSURE again: no batch was taken since a push-back in this
      # pass (no room), it passes the staleness bound (`flow.admit`'s test), and its group holds no reservation
      # (`GroupBuffer.reserve` succeeds for an open group). Only the O(leases) dispenser calls are saved.
      if (full_at == (self._takes, self.version)
          and flow.is_fresh(self.version, episode.version, self.config.max_staleness)
          and episode.lease.group_id not in self.buffer.open):
        self._blocked.append(episode)
      elif not self._submit(episode):
        full_at = (self._takes, self.version)
        self._blocked.append(episode)

  def _heartbeat(self, _=None) -> None:
    if self._running:
      self.dispenser.heartbeat(list(self._running), _WORKER)
    self._at(self.now + self.config.lease_ttl_s / 3, "heartbeat")

  # ------------------------------------------------------------------------------------------------ trainer side
  def _take(self) -> None:
    c, r = self.config, self.report
    batch = self.buffer.take(c.batch_size)
    if batch is None:
      return
    self._training = True
    self._takes += 1
    measured = r.steps >= c.warmup_steps
    if measured:
      if self._measure_start is None:
        self._measure_start = self._wait_start
      r.waiting_s += self.now - self._wait_start
      r.measured_steps += 1
    fresh = 0
    for traj in batch:
      if measured:
        s = flow.staleness(self.version, traj.policy_version)
        r.staleness[s] = r.staleness.get(s, 0) + 1
        if traj.metrics["leased_at"] >= self._measure_start:
          r.staleness_steady[s] = r.staleness_steady.get(s, 0) + 1
      if flow.is_fresh(self.version, traj.policy_version, c.max_staleness):
        fresh += 1
      else:
        r.dropped_stale += 1
        r.discarded_s += self._episode_seconds(traj)
    r.in_learner = self._batch_fresh = fresh
    if not fresh:
      step_s = 0.0  # nothing trainable: the trainer skips the update (and publishes nothing)
    elif r.steps < len(c.warmup_step_s):
      step_s = c.warmup_step_s[r.steps]
    else:
      step_s = c.step_s.sample(self._rng)
    f = c.publish_fraction
    fe = f if c.engine_publish_fraction is None else c.engine_publish_fraction
    publishes = bool(fresh) and self._updates + 1 > c.actor_warmup_steps
    if publishes and fe < f:  # engines first
      self._at(self.now + fe * step_s, "engines", self.version + 1)
    if self._clock is not None and fresh:
      self._trainer_busy(step_s + (c.publish_s if publishes else 0.0))
    self._at(self.now + f * step_s, "train_end", (1.0 - f) * step_s)
    self._schedule_retry()  # room in the buffer: pushed-back samples may go in now
    self._poll()

  def _episode_seconds(self, traj: Trajectory) -> float:
    return float(traj.metrics.get("episode_s", 0.0))

  def _train_end(self, rest_s: float) -> None:
    """The update is done; the new version (if any) is published, then `rest_s` of the step remains."""
    c, r = self.config, self.report
    r.trained += self._batch_fresh
    r.in_learner = 0
    if r.steps >= c.warmup_steps:  # the bench's wall: to the end of the last measured step's training
      r.measured_s = self.now - self._measure_start
    if c.target_trajectories and r.time_to_target_s is None and r.trained >= c.target_trajectories:
      r.time_to_target_s = self.now
    if self._batch_fresh:
      self._updates += 1
      if self._updates > c.actor_warmup_steps:
        self._at(self.now + c.publish_s, "publish_end", (self.version + 1, rest_s))
        return
    self._after(rest_s)

  def _engines_updated(self, version: int) -> None:
    self.engine_version = max(self.engine_version, version)

  def _publish_end(self, payload: tuple[int, float]) -> None:
    version, rest_s = payload
    self.version = version
    self.engine_version = max(self.engine_version, version)
    self.dispenser.set_policy_version(version)
    self._schedule_retry()  # a new version may make pushed-back samples stale
    self._after(rest_s)

  def _after(self, rest_s: float) -> None:
    if rest_s > 0:
      self._at(self.now + rest_s, "step_done")
    else:
      self._step_done()

  def _step_done(self, _=None) -> None:
    c, r = self.config, self.report
    r.steps += 1
    self._training = False
    if r.steps > c.warmup_steps:
      r.measured_s = self.now - self._measure_start
    self._wait_start = self.now
    if not self._done():
      self._take()


def simulate(config: FleetConfig) -> FleetReport:
  """Runs one simulated fleet (`FleetSimulator`)."""
  return FleetSimulator(config).run()
