"""The tables of the sweeps committed under `experiments/paper/runs/` (the numbers of docs/results_seeds.md and docs/results_critic.md).

Each committed sweep's printed tables are pinned: a change to the analysis, or to the committed runs, that moves a
number in those pages shows up here.
"""
from __future__ import annotations

import os
import re

import pytest

from experiments.paper import sweeps


def _report(name: str) -> str:
  if not os.path.isdir(os.path.join(sweeps.RUNS_ROOT, name)):
    pytest.fail(f"experiments/paper/runs/{name} is missing: docs/results_seeds.md or docs/results_critic.md reports it")
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
  text = _report("toy_matched_concurrency")  # seeds 0 (2026-11-30) and 1 (2026-12-01), same code version
  assert "code version e4f743b5aba6447dd9608f41567be09d667be6e8" in text
  assert "8 runs started: 8 complete, 0 incomplete" in text
  assert "Not started" not in text
  assert ("| sao-loops16 | 2/2 | 1.2 [0.1, 2.3] (2/2) | 0.712 [0.439, 0.985] | 0.85 [0.79, 0.91] | "
          "0.76 [-0.47, 1.98] | 3.2 [-2.4, 8.7] | 77.2 [52.4, 102.0] |") in text
  assert ("| gspo-loops64 | 2/2 | 0.9 [-0.3, 2.1] (2/2) | 0.435 [0.003, 0.867] | 1.08 [-0.60, 2.75] | "
          "0.49 [-0.26, 1.24] | 1.9 [-1.0, 4.9] | 69.4 [4.9, 133.9] |") in text
  assert "| sao | seconds per RL step | 1.16 [1.03, 1.29] (n=2) |" in text
  assert "| gspo | seconds per RL step | 1.00 [0.50, 1.49] (n=2) |" in text
  assert "| gspo-loops64-seed1 | gspo-loops64 | 1 | complete | 239 / 239 | 48.8 → 64.3 | v240 |  |" in text


def test_toy_ablations_tables():
  text = _report("toy_ablations")  # the stabilized arm is toy_algorithms' sao-seed{0,1,2} (same config, same code)
  assert "code version e4f743b5aba6447dd9608f41567be09d667be6e8" in text
  assert "27 runs started: 27 complete, 0 incomplete" in text
  assert ("| stabilized | the stabilized recipe | 3/3 | 78.3 [68.9, 87.7] | 76.9 [68.9, 84.8] | — | — | "
          "82.6 [74.7, 90.4] | 0.152 [0.102, 0.203] |") in text
  assert ("| no_whitening | advantages not whitened | 3/3 | 76.9 [67.1, 86.7] | 78.0 [71.7, 84.4] | "
          "-1.4 [-2.1, -0.6] (paired t, n=3) | +1.2 [-3.3, 5.7] (paired t, n=3) |") in text
  assert ("| cold_critic | no critic warm start (cold critic) | 3/3 | 78.2 [70.2, 86.2] | 78.2 [71.1, 85.3] | "
          "-0.1 [-7.2, 7.0] (paired t, n=3) | +1.3 [-4.1, 6.8] (paired t, n=3) |") in text
  assert ("| fixed_lambda | fixed policy λ = 0.95 (vs length-adaptive) | 3/3 | 73.9 [65.9, 81.9] | "
          "73.9 [69.3, 78.6] | -4.4 [-7.8, -1.1] (paired t, n=3) | -2.9 [-6.9, 1.1] (paired t, n=3) |") in text
  assert ("| stabilized-seed1 | stabilized | 1 | complete | 249 / 249 | 46.1 → 74.0 | v220 | the toy_algorithms "
          "sweep's sao-seed1 run (same config and code version), not re-run |") in text
  assert "| warmup0-seed1 | warmup0 | 1 | complete | 249 / 249 | 45.1 → 72.4 | v240 |  |" in text


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_toy_ablations_stabilized_arm_is_the_toy_algorithms_sao_run(seed):
  """docs/results_seeds.md says the stabilized arm reuses toy_algorithms' SAO runs: their committed files must agree."""
  for name in ("metrics.jsonl", "evaluation/v220.json"):
    with open(os.path.join(sweeps.RUNS_ROOT, "toy_ablations", f"stabilized-seed{seed}", name), "rb") as f:
      reused = f.read()
    with open(os.path.join(sweeps.RUNS_ROOT, "toy_algorithms", f"sao-seed{seed}", name), "rb") as f:
      original = f.read()
    assert reused == original, name


def test_the_folders_readme_lists_every_committed_sweep_with_its_run_count():
  """experiments/paper/runs/README.md's table states what the folder holds: each sweep and its number of runs."""
  with open(os.path.join(sweeps.RUNS_ROOT, "README.md"), encoding="utf-8") as f:
    listed = {name: int(n) for name, n in re.findall(r"^\| `(\w+)` \| (\d+) \|", f.read(), re.M)}
  committed = {name: len(os.listdir(os.path.join(sweeps.RUNS_ROOT, name))) for name in os.listdir(sweeps.RUNS_ROOT)
               if os.path.isdir(os.path.join(sweeps.RUNS_ROOT, name))}
  assert listed == committed


def test_toy_critic_matters_tables():
  """Issue 48's search_chain sweep, all 10 runs (docs/results_critic.md)."""
  text = _report("toy_critic_matters")
  assert "code version dd9b84cbb887192cbfe4d714db2e872ca5c2ddac" in text
  assert "10 runs started: 10 complete, 0 incomplete" in text
  assert "| sao | the stabilized recipe | 5/5 | 48.3 [40.5, 56.2] |" in text
  assert "| frozen_critic | critic frozen at initialisation (learning rate 0) | 5/5 | 32.6 [13.4, 51.7] | — | " \
      "-15.8 [-34.7, 3.1] (paired t, n=5) |" in text
  for row in ("| sao-seed0 | sao | 0 | complete | 99 / 99 | 45.3 → 47.7 | — |  |",
              "| frozen_critic-seed0 | frozen_critic | 0 | complete | 99 / 99 | 44.1 → 5.5 | — |  |",
              "| sao-seed4 | sao | 4 | complete | 99 / 99 | 46.5 → 46.9 | — |  |",
              "| frozen_critic-seed4 | frozen_critic | 4 | complete | 99 / 99 | 41.8 → 37.5 | — |  |"):
    assert row in text, row

def test_toy_chain_offpolicy_tables():
  """Issue 48's off-policy options on search_chain, all 36 runs (docs/results_critic.md)."""
  text = _report("toy_chain_offpolicy")
  assert "code version dd9b84cbb887192cbfe4d714db2e872ca5c2ddac" in text
  assert "36 runs started: 36 complete, 0 incomplete" in text
  assert "| icepop | IcePop masked actor loss ([0.5, 5]) instead of DIS | 3/3 | 50.7 [26.3, 75.0] | — | " \
      "+3.2 [-1.1, 7.5] (paired t, n=3) |" in text
  assert "| stress | 3/3 | 31.6 [-37.7, 100.9] | — | — | 1/3 | 44 |" in text
  assert "| stress_vtrace | 3/3 | 33.6 [-39.8, 107.0] | +2.0 [-132.6, 136.6] (paired t, n=3) | — | 1/3 | 51 |" in text
  assert "| stress_adaptive_staleness | 3/3 | 53.0 [31.9, 74.2] | +21.4 [-58.6, 101.5] (paired t, n=3) | — | 0/3 | — |" \
      in text


def test_toy_offpolicy_tables():
  """Issue 48's off-policy options on number search, all 36 runs (docs/results_critic.md)."""
  text = _report("toy_offpolicy")
  assert "code version 48ec73c" in text
  assert "36 runs started: 36 complete, 0 incomplete" in text
  assert "| stabilized | the stabilized recipe | 3/3 | 73.9 [63.1, 84.6] | — | — | — |" in text
  assert "| icepop | IcePop masked actor loss ([0.5, 5]) instead of DIS | 3/3 | 78.2 [76.2, 80.2] | — | " \
      "+4.3 [-7.4, 16.1] (paired t, n=3) |" in text
  assert "| ev_gate | actor start gated on critic EV (0.3 over 5 updates, cap 100) instead of the fixed warm-up | 3/3 " \
      "| 71.8 [60.1, 83.4] | — | -2.1 [-7.8, 3.7] (paired t, n=3) |" in text
  assert "| stress | 3/3 | 28.8 [-95.2, 152.8] | — | — | 2/3 | 61, 62 |" in text
  assert "| stress_tis | 3/3 | 31.0 [-102.3, 164.3] | +2.2 [-7.2, 11.5] (paired t, n=3) | — | 2/3 | 40, 41 |" in text
  assert "| stress_icepop | 3/3 | 58.7 [-67.7, 185.1] | +29.9 [-89.8, 149.5] (paired t, n=3) | — | 1/3 | 40 |" in text
  assert "| stress_ev_gate | 3/3 | 0.0 [0.0, 0.0] | -28.8 [-152.8, 95.2] (paired t, n=3) | — | 3/3 | 131, 170, 140 |" \
      in text
  assert "| stress_adaptive_staleness | 3/3 | 54.8 [-63.1, 172.6] | +26.0 [-92.5, 144.4] (paired t, n=3) | — | 1/3 " \
      "| 81 |" in text
