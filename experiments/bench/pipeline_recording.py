"""The pipeline bench's recording: a trainer that timestamps every step, lease, acceptance and publish, the sync
mode's lease gate, a watch on the engine's weight version, and the per-mode summary of what they recorded
(`experiments/bench/bench_pipeline.py`, whose `--out` JSON `sao.simulation.validation` reads).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.request
from typing import Any, Sequence

# the repository, two folders up: this checkout's `sao`
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class LeaseGate:
  """Sync mode: the dispenser hands out at most `open(n)`'s n training leases, then nothing until the next open."""

  def __init__(self, lease_fn):
    self._lease = lease_fn
    self._lock = threading.Lock()
    self._budget = 0

  def open(self, n: int) -> None:
    with self._lock:
      self._budget = n

  def lease(self, worker_id: str, max_tasks: int):
    with self._lock:
      if self._budget <= 0:
        return []
      leases = self._lease(worker_id, min(max_tasks, self._budget))
      self._budget -= sum(not l.is_validation for l in leases)
      return leases


class EngineVersionWatch:
  """Polls the engine's `GET /get_model_info` every `interval_s` in a thread and records when each new
  `weight_version` first shows: when a published version really starts to stamp trajectories (the trainer's
  publish call returns only after the engine swapped, and the step goes on with bookkeeping after it)."""

  def __init__(self, url: str, interval_s: float = 0.02):
    self.url, self.interval_s = url, interval_s
    self.changes: list[tuple[float, int]] = []  # (monotonic time first seen, version)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True, name="engine-version-watch")
    self._thread.start()

  def _run(self) -> None:
    last = None
    while not self._stop.wait(self.interval_s):
      try:
        with urllib.request.urlopen(f"{self.url}/get_model_info", timeout=5) as response:
          version = int(json.loads(response.read()).get("weight_version", -1))
      except (OSError, ValueError):
        continue  # the engine is busy or restarting: the next poll tells
      if version != last:
        self.changes.append((time.monotonic(), version))
        last = version

  def stop(self) -> None:
    self._stop.set()
    self._thread.join(timeout=10)


def bench_trainer_class():
  from sao.train import trainer as trainer_lib  # pylint: disable=g-import-not-at-top

  class BenchTrainer(trainer_lib.Trainer):
    """The real trainer, timing how long each step waits for its batch (and gating leases in sync mode)."""

    def __init__(self, *args, sync: bool, **kwargs):
      super().__init__(*args, **kwargs)
      self.sync = sync
      self.gate: LeaseGate | None = None
      self.waits: list[tuple[float, float]] = []  # (start, end) of each step's wait for its batch
      self.end_time = 0.0
      self.server = None
      # Per step: learner version − policy version of each trajectory taken (not `staleness`: the trainer's own).
      self.taken_staleness: list[list[int]] = []
      self.turns: list[float] = []  # per step: mean assistant turns of the batch
      self.timings: list[dict[str, float]] = []  # per step: the batch's mean agent-loop timings (generate_s, ...)
      self.leased_at: dict[str, float] = {}  # training lease id → when it was issued
      self.episode_s: list[tuple[float, float]] = []  # (accepted at, seconds from lease to acceptance) per sample
      self.accepted_at: dict[str, float] = {}  # training lease id → when its sample was accepted
      self.published_at: list[float] = []  # when each new version reached the engines and the server
      self.publish_started: list[float] = []  # when each publish began (policy export, then the engines)
      # Per trajectory taken: its lease, acceptance and take times, versions and the agent loop's timings.
      self.taken: list[dict[str, float]] = []

    def _server(self, model_config, engine_urls):
      server = super()._server(model_config, engine_urls)
      # The worker polls an empty lease response after this long: keep it short so the sync mode's per-step
      # restart is not dominated by polling (both modes get it).
      server.config.no_work_retry_ms = 50
      self._time_episodes(server.dispenser)
      if self.sync:
        self.gate = LeaseGate(server.dispenser.lease)
        server.dispenser.lease = self.gate.lease
      self.server = server
      return server

    def _time_episodes(self, dispenser):
      """Wraps the dispenser's lease and complete to time each training sample from lease to acceptance."""
      lease_fn, complete_fn = dispenser.lease, dispenser.complete

      def lease(worker_id, max_tasks):
        leases = lease_fn(worker_id, max_tasks)
        now = time.monotonic()
        self.leased_at.update((l.lease_id, now) for l in leases if not l.is_validation)
        return leases

      def complete(lease_record, traj):
        if lease_record.lease_id in self.leased_at:
          now = time.monotonic()
          self.episode_s.append((now, now - self.leased_at[lease_record.lease_id]))
          self.accepted_at[lease_record.lease_id] = now
        return complete_fn(lease_record, traj)

      dispenser.lease, dispenser.complete = lease, complete

    def _publish(self, model_config, learner, wait=True):
      # Every publish is waited for here (not in the background, `sao.train.publication`), so `published_at` is when
      # the engines serve the version, as the timeline's fractions assume.
      del wait
      self.publish_started.append(time.monotonic())
      out = super()._publish(model_config, learner, wait=True)
      self.published_at.append(time.monotonic())
      return out

    def _take(self, server, n):
      start = time.monotonic()
      if self.gate is not None:
        self.gate.open(n)
      batch = super()._take(server, n)
      self.waits.append((start, time.monotonic()))
      # The server's version is the learner's here (the trainer publishes after every update): the trainer's count.
      self.taken_staleness.append([server.policy_version - t.policy_version for t in batch])
      self.turns.append(sum(t.num_turns for t in batch) / len(batch))
      self.timings.append({k: sum(t.timings.get(k, 0.0) for t in batch) / len(batch)
                           for k in ("generate_s", "tool_s", "total_s")})
      now = time.monotonic()
      for t in batch:
        self.taken.append({
            "step": len(self.waits) - 1, "leased_at": self.leased_at.get(t.lease_id, float("nan")),
            "accepted_at": self.accepted_at.get(t.lease_id, float("nan")), "taken_at": now,
            "policy_version": t.policy_version, "server_version": server.policy_version, "turns": t.num_turns,
            **{k: float(t.timings.get(k, 0.0)) for k in ("generate_s", "tool_s", "total_s")}})
      return batch

    def _train(self, *args, **kwargs):
      out = super()._train(*args, **kwargs)
      self.end_time = time.monotonic()
      return out

  return BenchTrainer


def summarize_mode(mode: str, trainer: Any, engine_changes: Sequence[tuple[float, int]], warmup: int,
                   batch_size: int) -> dict[str, Any]:
  """One mode's measurements from a finished `bench_trainer_class()` trainer: throughput (trajectories/s trained on)
  and busy fraction (1 − waiting / wall) over the steps after `warmup`, staleness, step and publish times, and the
  timeline (seconds from the first measured step's wait). `engine_changes`: `EngineVersionWatch.changes`."""
  measured = trainer.waits[warmup:]
  start = measured[0][0]
  wall = trainer.end_time - start
  waiting = sum(end - begin for begin, end in measured)
  stats = trainer.server.stats() if trainer.server is not None else {}
  # Step i trains from the end of its wait to the start of the next wait (the last one: to the end of training).
  ends = [begin for begin, _ in trainer.waits[1:]] + [trainer.end_time]
  train_s = [end - waited for (_, waited), end in zip(trainer.waits, ends)]
  staleness = [s for step in trainer.taken_staleness[warmup:] for s in step]
  # Where in its step each measured version landed (0: at the take, 1: at the next wait): the rest is bookkeeping.
  publish_fraction = [(p - waited) / (end - waited) for (_, waited), end in zip(trainer.waits[warmup:], ends[warmup:])
                      for p in trainer.published_at if waited <= p <= end and end > waited]
  # The same for the moment the engine itself first reported the new version (`EngineVersionWatch`).
  engine_fraction = [(t - waited) / (end - waited) for (_, waited), end in zip(trainer.waits[warmup:], ends[warmup:])
                     for t, version in engine_changes if version > 0 and waited <= t <= end and end > waited]
  # Each step's parts: the learner update (to the publish's start) and the publish (export + engines).
  publish_s = [done - began for began, done in zip(trainer.publish_started, trainer.published_at)]
  return {"mode": mode, "traj_per_s": len(measured) * batch_size / wall,
          "busy": 1.0 - waiting / wall, "wall_s": wall, "steps": len(measured),
          "stale_rejected": stats.get("rejected_by_reason", {}).get("STALE_POLICY", 0),
          "staleness_mean": sum(staleness) / max(len(staleness), 1), "staleness": staleness,
          "train_step_s": train_s[warmup:], "warmup_train_step_s": train_s[:warmup],
          "episode_s": [d for t, d in trainer.episode_s if t >= start],
          "publish_fraction_mean": sum(publish_fraction) / len(publish_fraction) if publish_fraction else 1.0,
          "engine_publish_fraction_mean": (sum(engine_fraction) / len(engine_fraction) if engine_fraction
                                           else float("nan")),
          "publish_s": publish_s,
          # Times in seconds from the first measured step's wait: the steps' (wait start, wait end), the publishes'
          # (start, end), the engine's version changes (time, version), the first training lease (the simulated
          # twin's time 0), and every trajectory taken.
          "timeline": {"waits": [(a - start, b - start) for a, b in trainer.waits],
                       "first_lease": min(trainer.leased_at.values(), default=start) - start,
                       "publishes": [(a - start, b - start) for a, b in zip(trainer.publish_started,
                                                                             trainer.published_at)],
                       "engine_versions": [(t - start, v) for t, v in engine_changes],
                       "end": trainer.end_time - start},
          "taken": [{k: (v - start if k.endswith("_at") else v) for k, v in t.items()} for t in trainer.taken],
          "turns_mean": sum(trainer.turns[warmup:]) / max(len(trainer.turns[warmup:]), 1),
          # The agent loop's own seconds per trajectory (engine calls, env steps, the whole episode incl. reset).
          **{f"{k}_mean": sum(t[k] for t in trainer.timings[warmup:]) / max(len(trainer.timings[warmup:]), 1)
             for k in ("generate_s", "tool_s", "total_s")}}
