"""The tables of the sweeps committed under `experiments/paper/runs/` (docs/results.md's numbers, issue 21).

Each committed sweep's printed tables are pinned: a change to the analysis, or to the committed runs, that moves a
number in docs/results.md shows up here.
"""
from __future__ import annotations

import os

import pytest

from experiments.paper import sweeps


def _report(name: str) -> str:
  if not os.path.isdir(os.path.join(sweeps.RUNS_ROOT, name)):
    pytest.fail(f"experiments/paper/runs/{name} is missing: docs/results.md reports it")
  text, groups = sweeps.sweep_report(name, "")
  assert len(groups) == 1  # one code version per comparison
  return text


def test_toy_algorithms_tables():
  text = _report("toy_algorithms")
  assert "code version e4f743b5aba6447dd9608f41567be09d667be6e8" in text
  assert "15 runs started: 15 complete, 0 incomplete" in text
  assert ("| sao | 5/5 | 46.6 [41.4, 51.8] | 76.2 [70.8, 81.6] | 79.5 [73.3, 85.7] | 75.2 [70.1, 80.4] | "
          "70.3 [63.0, 77.5] | 80.8 [77.0, 84.6] | 4,518 [2,280, 6,757] (5/5) | 1.5 [1.1, 1.9] (5/5) | "
          "0.147 [0.127, 0.168] |") in text
  assert ("| gspo | 5/5 | 44.6 [39.9, 49.4] | 67.9 [57.8, 77.9] | 73.0 [66.5, 79.5] | 66.8 [58.1, 75.6] | "
          "60.9 [50.7, 71.1] | 69.9 [66.0, 73.8] | 5,414 [2,476, 8,353] (5/5) | 1.1 [0.7, 1.5] (5/5) | — |") in text
  assert ("| grpo | 5/5 | 45.7 [40.7, 50.6] | 61.5 [45.9, 77.1] | 70.3 [61.7, 79.0] | 55.2 [16.1, 94.3] | "
          "49.8 [14.8, 84.8] | 57.5 [17.2, 97.8] | 6,170 [2,592, 9,747] (5/5) | 1.2 [0.8, 1.7] (5/5) | — |") in text
  assert ("| in-run validation, last-3 mean (points) | +8.3 [3.6, 13.1] (paired t, n=5) | "
          "+14.7 [3.9, 25.6] (paired t, n=5) |") in text
  assert ("| re-measured validation (points) | +8.4 [3.6, 13.2] (paired t, n=5) | "
          "+20.0 [-14.7, 54.7] (paired t, n=5) |") in text
  assert ("| re-measured test (points) | +9.4 [3.9, 14.8] (paired t, n=5) | "
          "+20.4 [-10.6, 51.5] (paired t, n=5) |") in text
  assert "| grpo-seed4 | grpo | 4 | complete | 239 / 239 | 44.7 → 41.4 | v240 |  |" in text


def test_toy_matched_concurrency_tables():
  text = _report("toy_matched_concurrency")  # seed 0 of each arm so far; seed 1 still to run (same version)
  assert "code version e4f743b5aba6447dd9608f41567be09d667be6e8" in text
  assert "4 runs started: 4 complete, 0 incomplete" in text
  assert ("Not started (or not committed) yet: 4 of the sweep's runs — sao-loops16-seed1, gspo-loops16-seed1, "
          "sao-loops64-seed1, gspo-loops64-seed1.") in text
  assert ("| sao-loops16 | 1/1 | 1.3 (n=1) (1/1) | 0.691 (n=1) | 0.84 (n=1) | 0.85 (n=1) | 3.6 (n=1) | "
          "79.2 (n=1) |") in text
  assert ("| gspo-loops64 | 1/1 | 0.8 (n=1) (1/1) | 0.469 (n=1) | 1.21 (n=1) | 0.55 (n=1) | 2.2 (n=1) | "
          "74.5 (n=1) |") in text
  assert "| sao | seconds per RL step | 1.17 (n=1) |" in text
  assert "| gspo | minutes to ≥ 60 % | 0.41 (n=1) |" in text
