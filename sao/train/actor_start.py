"""When SAO's actor starts stepping (`sao.actor_start`): after a fixed number of critic-only updates, or once the
critic has shown it can predict the returns.

    "steps"      the actor steps from update `critic_warmup_steps` on (the stabilized recipe's 20; today's rule)
    "critic_ev"  the actor steps from the first update `u` with
                     u ≥ actor_start_max_steps                                              (the cap), or
                     (1/W) Σ_{j=u−W}^{u−1} EV_j ≥ actor_start_ev_threshold,   W = actor_start_ev_window,
                 and on every update after (the gate latches).

`EV_j = 1 − Var_m(R − V⁰)/Var_m(R)` is update j's `critic/explained_variance`: the critic's pre-update values V⁰
against that update's targets R over the batch's action tokens — the critic judged on a batch it has not trained on.
A window of W updates, all before `u`, averages out one lucky batch; the cap bounds the wait when the critic never
gets there (a sparse-reward batch with one outcome has Var R = 0 and EV 0; an EV below −1 enters the window as −1).

Multi-process: the EVs are globally reduced device metrics fetched to every process as the same numbers
(`Learner.update_traced`), so every process's gate holds the same window and decides the same; the decision and the
window go into the update plan (`sao.train.update_plan`), which the processes compare before each update, so a
process that would decide otherwise stops the job instead of running other programs. The gate's state is part of
the learner's checkpoint metadata (`state_dict`).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

EV_METRIC = "critic/explained_variance"
EV_FLOOR = -1.0  # the lowest EV the window stores (`ActorStart.observe`)


class ActorStart:
  """The gate of one SAO learner (module docstring). `decide(num_updates)` before an update, `observe(metrics)` after
  it. Pure bookkeeping on host floats; no JAX."""

  def __init__(self, sao_config: Any):
    self.mode = sao_config.actor_start
    if self.mode not in ("steps", "critic_ev"):
      raise ValueError(f"sao.actor_start must be 'steps' or 'critic_ev', got {self.mode!r}")
    self.warmup_steps = int(sao_config.critic_warmup_steps)
    self.threshold = float(sao_config.actor_start_ev_threshold)
    self.window = int(sao_config.actor_start_ev_window)
    self.max_steps = int(sao_config.actor_start_max_steps)
    if self.window < 1 or self.max_steps < 0:
      raise ValueError(f"sao.actor_start_ev_window must be >= 1 and sao.actor_start_max_steps >= 0, got "
                       f"{self.window}, {self.max_steps}")
    self.recent: list[float] = []  # the last `window` updates' EVs, oldest first
    self.started_at: int | None = None  # critic_ev: the update the gate opened at
    self.reason = ""  # critic_ev: "ev" or "cap"

  def window_mean(self) -> float | None:
    """The mean EV of the last `window` updates; None before `window` updates were observed."""
    return sum(self.recent) / self.window if len(self.recent) == self.window else None

  def decide(self, num_updates: int) -> bool:
    """Whether update number `num_updates` (0-based) takes the actor step. Idempotent until the next `observe`."""
    if self.mode == "steps":
      return num_updates >= self.warmup_steps
    if self.started_at is None:
      mean = self.window_mean()
      if num_updates >= self.max_steps:
        self.started_at, self.reason = num_updates, "cap"
      elif mean is not None and mean >= self.threshold:
        self.started_at, self.reason = num_updates, "ev"
    return self.started_at is not None

  def observe(self, metrics: Mapping[str, float]) -> None:
    """Takes a finished update's EV into the window (a non-finite or missing one counts as no evidence: −∞ would
    keep the gate shut for W updates, so it is stored as 0, no better than the mean). An EV below −1 is stored as
    −1: targets of almost no variance (a batch of zero rewards, V-trace's nearly constant targets) give EVs like
    −50 that say nothing more than "worse than the mean", yet would hold the window's mean down for W updates."""
    if self.mode == "steps":
      return
    ev = float(metrics.get(EV_METRIC, 0.0))
    self.recent = (self.recent + [max(ev, EV_FLOOR) if math.isfinite(ev) else 0.0])[-self.window:]

  def plan(self, num_updates: int) -> dict[str, Any]:
    """What the update plan carries: the decision and, for critic_ev, the window it came from."""
    out: dict[str, Any] = {"actor_step": bool(self.decide(num_updates))}
    if self.mode == "critic_ev":
      out["actor_start"] = {"recent_ev": list(self.recent), "started_at": self.started_at}
    return out

  def metrics(self) -> dict[str, float]:
    """`actor/start_ev_window_mean` (NaN before a full window) and `actor/started_at` (−1 while shut), critic_ev
    only."""
    if self.mode == "steps":
      return {}
    mean = self.window_mean()
    return {"actor/start_ev_window_mean": float("nan") if mean is None else mean,
            "actor/started_at": -1.0 if self.started_at is None else float(self.started_at)}

  def state_dict(self) -> dict[str, Any]:
    return {"recent": list(self.recent), "started_at": self.started_at, "reason": self.reason}

  def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
    """Restores `state_dict()`; None (a checkpoint from before the gate existed) leaves the fresh state."""
    if state is None:
      return
    self.recent = [float(x) for x in state["recent"]][-self.window:]
    self.started_at = None if state["started_at"] is None else int(state["started_at"])
    self.reason = str(state.get("reason", ""))
