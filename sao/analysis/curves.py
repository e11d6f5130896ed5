"""Training curves from a run's JSONL metric log: reward, validation, turns, response length, critic diagnostics."""
from __future__ import annotations

import json
import os

import numpy as np

PANELS = (
    ("reward", "reward (ten-point mean)"),
    ("validation", "validation success"),
    ("turns", "assistant turns"),
    ("response_length", "response length (action tokens)"),
    ("critic/explained_variance", "critic explained variance"),
    ("staleness", "policy staleness"),
)


def read_metrics(path: str) -> list[dict]:
  """The metric records of a JSONL log; a torn final line (a crash mid-write) is ignored."""
  records = []
  with open(path, encoding="utf-8") as f:
    lines = f.read().splitlines()
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      if i == len(lines) - 1:
        break
      raise ValueError(f"{path}:{i + 1}: not JSON: {e}") from e
    if "step" in record:
      records.append(record)
  return records


# The trainer writes each evaluation once with this key; its per-step progress rows repeat the latest `validation`,
# which must not count as new evaluations.
EVAL_RECORD_KEY = "validation/num_tasks"


def series(records: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps, values) of the records that have a non-null `key`."""
  points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
  if not points:
    return np.zeros(0), np.zeros(0)
  steps, values = zip(*points)
  return np.asarray(steps, float), np.asarray(values, float)


def running_mean(values: np.ndarray, window: int = 10) -> np.ndarray:
  """Trailing mean over up to `window` points (the write-up's "ten-point means")."""
  if values.size == 0:
    return values
  cumsum = np.cumsum(np.insert(values, 0, 0.0))
  idx = np.arange(1, values.size + 1)
  lo = np.maximum(idx - window, 0)
  return (cumsum[idx] - cumsum[lo]) / (idx - lo)


def plot_training_curves(metrics_path: str, out_path: str) -> str:
  """Writes a PNG grid of the run's curves; returns `out_path`."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  records = read_metrics(metrics_path)
  fig, axes = plt.subplots(2, 3, figsize=(13, 7))
  for ax, (key, title) in zip(axes.ravel(), PANELS):
    steps, values = series(records, key)
    if key == "validation":
      # One point per evaluation (progress rows repeat the latest value), when the log marks evaluations.
      evaluations = [r for r in records if EVAL_RECORD_KEY in r]
      if evaluations:
        steps, values = series(evaluations, key)
      ax.plot(steps, values, "o-", ms=3)
    elif steps.size:
      ax.plot(steps, values, alpha=0.3)
      ax.plot(steps, running_mean(values), lw=2)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  fig.savefig(out_path, dpi=90)
  plt.close(fig)
  return out_path
