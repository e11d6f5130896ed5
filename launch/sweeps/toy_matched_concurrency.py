r"""Matched concurrency (issue 21, item 3): SAO and GSPO with the same agent loops and the same engine capacity, at
16 and 64 loops, 2 seeds each.

Each run has one rollout worker with `LOOPS` agent loops (`rollout.concurrency`) and one local engine whose batch
holds every loop (`launch.embedded.engine_args`: `--max_batch_size=<rollout.concurrency>`), so at a given loop count
SAO and GSPO get identical sampling capacity; both train 240 RL steps × 64 trajectories. The table compares wall time
to the threshold, the trainer's busy fraction and staleness side by side, and the 16 → 64 speed-up against the
write-up's assumed linear scaling (4×).

    python -m launch.local --sweep=launch/sweeps/toy_matched_concurrency.py --workdir=/tmp/toy_mc --max_parallel=1
    python experiments/paper/trim.py --sweep=toy_matched_concurrency --workdir=/tmp/toy_mc --evaluate
    python experiments/reproduce.py --sweep=toy_matched_concurrency
"""
from launch import sweep as s

SEEDS = (0, 1)
LOOPS = (16, 64)
TOTAL_STEPS = 240
CONFIGS = {"sao": "experiments/configs/sao_openswe.py:toy", "gspo": "experiments/configs/gspo_openswe.py:toy"}

ANALYSIS = {
    "kind": "concurrency",
    "algorithms": tuple(CONFIGS),
    "loops": LOOPS,
    "threshold_pct": 60.0,  # as toy_algorithms
}


def arm(algorithm: str, loops: int) -> str:
  return f"{algorithm}-loops{loops}"


def get_sweep() -> list[s.Run]:
  run_list = []
  for loops in LOOPS:
    grid = s.product(s.sweep("seed", SEEDS), s.fixed(**{"total_steps": TOTAL_STEPS, "rollout.concurrency": loops,
                                                        "num_workers": 1, "num_engines": 1}))
    for algorithm, config in CONFIGS.items():
      run_list += s.runs(arm(algorithm, loops), config, grid, name_keys=("seed",))
  s.check_equal_budgets(run_list)
  return run_list
