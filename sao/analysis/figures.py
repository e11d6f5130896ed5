"""The write-up's figures as PNGs from run logs (`runs.RunLog`) and critic traces (`critic_traces.CriticTrace`).

  Figure 1  cost ratios, GSPO = 100 (`plot_costs`, numbers from `runs.cost_ratios`)
  Figure 2  reward, validation, response length, turns over RL steps, one line per run (`plot_behaviour`)
  Figure 3  the same over normalised time (`plot_behaviour(..., axis="time")`; `tables.normalized_hours`)
  Figure 4  initial vs stabilized recipe: reward, validation, turns, response length, critic EV (`plot_recipes`)
  Figure 5  critic and actor diagnostics: EV on a symlog axis, advantage means (unsmoothed), grad norms with the
            1 and 10 clip guides (`plot_diagnostics`)
  Figure 7  critic traces: mean value and ΔV of every trace (top), one success and one failure with faint token
            values, thick per-turn means, message boundaries, the largest boundary jumps and the return targets
            (bottom) (`plot_critic_traces`)

Training curves are faint observations plus ten-point trailing means; validation is unsmoothed, one point per
evaluation. Every function writes `out_path` and returns it; matplotlib runs on the Agg backend (no display).
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np

from sao.analysis import critic_diagnostics as diag
from sao.analysis.critic_traces import CriticTrace
from sao.analysis.curves import plot_training_curves, running_mean
from sao.analysis.runs import EV_KEY, METRICS_FILE, RunLog, cost_ratios, normalized_hours, selected_examples

BEHAVIOUR_PANELS = (("reward", "reward"), ("validation", "validation success"),
                    ("response_length", "response length (action tokens)"), ("turns", "assistant turns"))
CLIP_GUIDES = (1.0, 10.0)


def _pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def _save(fig, out_path: str) -> str:
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  fig.tight_layout()
  fig.savefig(out_path, dpi=90)
  _pyplot().close(fig)
  return out_path


def _xy(run: RunLog, key: str, axis: str) -> tuple[np.ndarray, np.ndarray]:
  """(x, values) of `key` over RL steps ≥ 0, x = the step or normalised hours; validation: evaluations only."""
  if key == "validation":
    steps, values = run.evaluations()
  else:
    steps, values = run.series(key)
    keep = steps >= 0
    steps, values = steps[keep], values[keep]
  if axis == "step":
    return steps.astype(float), values
  if axis != "time":
    raise ValueError(f"axis: {axis!r} is not 'step' or 'time'")
  hours = normalized_hours(run)
  return np.asarray([hours.get(int(s), np.nan) for s in steps]), values


def _curve(ax, x: np.ndarray, y: np.ndarray, label: str, color, smooth: bool = True) -> None:
  if not x.size:
    return
  if smooth:
    ax.plot(x, y, color=color, alpha=0.25, lw=1)
    ax.plot(x, running_mean(y), color=color, lw=2, label=label)
  else:
    ax.plot(x, y, "o-", color=color, ms=3, label=label)


def plot_behaviour(runs: Sequence[RunLog], out_path: str, axis: str = "step") -> str:
  """Figure 2 (`axis="step"`) / Figure 3 (`axis="time"`): one line per run in four panels."""
  plt = _pyplot()
  fig, axes = plt.subplots(2, 2, figsize=(11, 7))
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for ax, (key, title) in zip(axes.ravel(), BEHAVIOUR_PANELS):
    for i, run in enumerate(runs):
      x, y = _xy(run, key, axis)
      _curve(ax, x, 100 * y if key == "validation" else y, run.name, colors[i % len(colors)],
             smooth=key != "validation")
    ax.set_title(title + (" (%)" if key == "validation" else ""))
    ax.set_xlabel("RL step" if axis == "step" else "normalised time (hours)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  return _save(fig, out_path)


def plot_recipes(initial: RunLog, stabilized: RunLog, out_path: str) -> str:
  """Figure 4: the initial and the stabilized recipe's reward, validation, turns, response length and critic EV."""
  plt = _pyplot()
  panels = BEHAVIOUR_PANELS + ((EV_KEY, "critic explained variance"),)
  fig, axes = plt.subplots(2, 3, figsize=(14, 7))
  for ax, (key, title) in zip(axes.ravel(), panels):
    for run, color in ((initial, "tab:orange"), (stabilized, "tab:blue")):
      x, y = _xy(run, key, "step")
      _curve(ax, x, 100 * y if key == "validation" else y, run.name, color, smooth=key != "validation")
    ax.set_title(title)
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  axes.ravel()[-1].axis("off")
  return _save(fig, out_path)


def plot_diagnostics(runs: Sequence[RunLog], out_path: str) -> str:
  """Figure 5: critic EV (symlog), advantage means before whitening (unsmoothed), critic and actor grad norms
  (ten-point means) with dotted guides at the clip thresholds 1 and 10."""
  plt = _pyplot()
  fig, axes = plt.subplots(2, 2, figsize=(11, 7))
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  panels = ((EV_KEY, "critic explained variance (symlog)", True), ("advantages/mean_before_whiten",
            "advantage mean (before whitening)", False), ("critic/grad_norm", "critic grad norm", True),
            ("actor/grad_norm", "actor grad norm", True))
  for ax, (key, title, smooth) in zip(axes.ravel(), panels):
    for i, run in enumerate(runs):
      x, y = _xy(run, key, "step")
      _curve(ax, x, y, run.name, colors[i % len(colors)], smooth=smooth)
    if key == EV_KEY:
      ax.set_yscale("symlog", linthresh=0.01)
    if key.endswith("grad_norm"):
      for guide in CLIP_GUIDES:
        ax.axhline(guide, ls=":", color="gray", lw=1)
      ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  return _save(fig, out_path)


def plot_costs(costs: Mapping[str, tuple[float, float | None]], out_path: str) -> str:
  """Figure 1: SAO's cost per measure relative to GSPO = 100, ours beside the write-up's (None: not reported)."""
  plt = _pyplot()
  names = list(costs)
  ours = [costs[n][0] for n in names]
  paper = [np.nan if costs[n][1] is None else costs[n][1] for n in names]
  x = np.arange(len(names))
  fig, ax = plt.subplots(figsize=(2.2 * len(names) + 2, 4))
  ax.bar(x - 0.2, ours, 0.4, label="SAO, this run (toy scale)")
  ax.bar(x + 0.2, paper, 0.4, label="SAO, write-up")
  ax.axhline(100.0, ls="--", color="gray", lw=1, label="GSPO = 100")
  ax.set_xticks(x, names, fontsize=8)
  ax.set_ylabel("relative cost (GSPO = 100)")
  ax.legend(fontsize=8)
  return _save(fig, out_path)


def _action_axis(trace: CriticTrace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """Action-token ordinals (the plot's x), their token positions, values and return targets."""
  positions = np.flatnonzero(trace.action_mask)
  return np.arange(positions.size), positions, trace.values[positions], trace.returns[positions]


def _plot_example(ax, trace: CriticTrace, color: str) -> None:
  x, positions, values, returns = _action_axis(trace)
  ax.plot(x, values, color=color, alpha=0.3, lw=1, label="token value")
  message = diag.message_index(trace.action_mask.size, trace.turn_boundaries)[positions]
  for m, _ in diag.per_turn_means(trace.values, trace.action_mask, trace.turn_boundaries):
    span = x[message == m]
    ax.plot([span[0], span[-1] + 1], [values[message == m].mean()] * 2, color=color, lw=3)
  for i in np.flatnonzero(message[1:] != message[:-1]) + 1:
    ax.axvline(i - 0.5, ls=":", color="gray", lw=0.8)
  ax.plot(x, returns, ls="--", color="black", lw=1, label="return target")
  ordinal = {int(p): i for i, p in enumerate(positions)}
  for position, delta in diag.largest_boundary_jumps(trace.values, trace.action_mask, trace.turn_boundaries, k=2):
    i = ordinal[position]
    ax.annotate("", xy=(i, values[i]), xytext=(i, values[i] - delta),
                arrowprops=dict(arrowstyle="->", color="red", lw=1.5))
  s = diag.trace_summary(trace.values, trace.action_mask)
  ax.set_title(f"{trace.kind} (step {trace.step}, reward {trace.reward:g}): V {s.first_value:.3f} → "
               f"{s.last_value:.3f}, ΔV {s.delta_v:+.3f}", fontsize=9)
  ax.set_xlabel("model-action token")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)


def plot_critic_traces(traces: Sequence[CriticTrace], out_path: str,
                       examples: tuple[CriticTrace, CriticTrace] | None = None) -> str:
  """Figure 7. `examples`: the (success, failure) shown below; default `tables.selected_examples(traces)`."""
  if not traces:
    raise ValueError("plot_critic_traces: no traces")
  examples = examples or selected_examples(traces)
  plt = _pyplot()
  fig = plt.figure(figsize=(12, 7))
  top = fig.add_subplot(2, 1, 1)
  summaries = [diag.trace_summary(t.values, t.action_mask) for t in traces]
  x = np.arange(len(traces))
  colors = ["tab:green" if t.kind == "success" else "tab:red" for t in traces]
  top.bar(x - 0.2, [s.mean_value for s in summaries], 0.4, color=colors, alpha=0.5, label="mean value")
  top.scatter(x + 0.2, [s.delta_v for s in summaries], c=colors, marker="D", s=18, label="ΔV = V[last] − V[first]")
  top.axhline(0.0, color="black", lw=0.8)
  top.set_xticks(x, [f"{t.step}{t.kind[0]}" for t in traces], fontsize=6, rotation=90)
  top.set_title("every trace (green: success, red: failure; label = step + s/f)", fontsize=9)
  top.legend(fontsize=8)
  for col, (trace, color) in enumerate(zip(examples, ("tab:green", "tab:red"))):
    if trace is not None:
      _plot_example(fig.add_subplot(2, 2, 3 + col), trace, color)
  return _save(fig, out_path)


def write_all(runs: Sequence[RunLog], reported: Mapping[str, Any], out_dir: str) -> list[str]:
  """Every figure the runs support, into `out_dir`: fig1_costs (runs `sao` and `gspo`), fig2_steps, fig3_time,
  fig4_recipes (`sao_initial` and `sao`), fig5_diagnostics (runs with critic metrics), fig7_critic_<run> (runs with
  critic traces) and each run's `<run>_curves.png` panel grid. Returns the written paths."""
  by_name = {r.name: r for r in runs}
  paths = [plot_behaviour(runs, os.path.join(out_dir, "fig2_steps.png")),
           plot_behaviour(runs, os.path.join(out_dir, "fig3_time.png"), axis="time")]
  if "sao" in by_name and "gspo" in by_name:
    paths.append(plot_costs(cost_ratios(by_name["sao"], by_name["gspo"], reported),
                            os.path.join(out_dir, "fig1_costs.png")))
  if "sao" in by_name and "sao_initial" in by_name:
    paths.append(plot_recipes(by_name["sao_initial"], by_name["sao"], os.path.join(out_dir, "fig4_recipes.png")))
  critic_runs = [r for r in runs if r.series(EV_KEY)[0].size]
  if critic_runs:
    paths.append(plot_diagnostics(critic_runs, os.path.join(out_dir, "fig5_diagnostics.png")))
  for run in runs:
    if run.traces:
      paths.append(plot_critic_traces(run.traces, os.path.join(out_dir, f"fig7_critic_{run.name}.png")))
    paths.append(plot_training_curves(os.path.join(run.workdir, METRICS_FILE),
                                      os.path.join(out_dir, f"{run.name}_curves.png")))
  return paths
