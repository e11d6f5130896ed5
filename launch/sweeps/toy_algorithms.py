r"""SAO vs GSPO vs GRPO on the held-out-range toy, 5 seeds each, at equal RL rollout budgets (issue 21, item 2).

Budget: every arm trains `TOTAL_STEPS` RL steps of 64 trajectories (SAO: 64 tasks × 1 rollout; GSPO and GRPO:
8 tasks × 8 rollouts), so 240 × 64 = 15,360 RL trajectories each — equalised in trajectories, not in steps
(`launch.sweep.check_equal_budgets` refuses the sweep otherwise). SAO's 10 value-pretraining steps (640 base-policy
trajectories, critic only) come before and are not counted, as in the write-up; the tables' wall time includes them.
Seed k gives every arm the same supervised base policy and task lists, so arms are compared seed by seed.

    python -m launch.local --sweep=launch/sweeps/toy_algorithms.py --workdir=/tmp/toy_algorithms --max_parallel=1
    python experiments/paper/trim.py --sweep=toy_algorithms --workdir=/tmp/toy_algorithms --evaluate
    python experiments/reproduce.py --sweep=toy_algorithms [--out_dir=/tmp/toy_algorithms_tables]
"""
from launch import sweep as s

SEEDS = (0, 1, 2, 3, 4)
TOTAL_STEPS = 240  # the SAO toy's own length (its cosine LR decays over it); GSPO and GRPO get the same
CONFIGS = {"sao": "experiments/configs/sao_openswe.py:toy", "gspo": "experiments/configs/gspo_openswe.py:toy",
           "grpo": "experiments/configs/grpo_openswe.py:toy"}

ANALYSIS = {
    "kind": "algorithms",
    "arms": tuple(CONFIGS),
    "reference": "sao",  # differences are reference − each other arm
    # Validation (%) every arm is timed to; fixed before the runs (the SAO toy's base policy validates at ~40 %).
    "threshold_pct": 60.0,
}


def get_sweep() -> list[s.Run]:
  grid = s.product(s.sweep("seed", SEEDS), s.fixed(total_steps=TOTAL_STEPS))
  run_list = [run for arm, config in CONFIGS.items() for run in s.runs(arm, config, grid, name_keys=("seed",))]
  s.check_equal_budgets(run_list)
  return run_list
