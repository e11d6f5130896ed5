r"""SAO (1 rollout per task, learned critic) vs GSPO (groups of G, no critic) on the toy, 3 seeds each.

    python -m launch.local --sweep=launch/sweeps/toy_sao_vs_gspo.py --workdir=/tmp/sao_vs_gspo --max_parallel=1
    python experiments/reproduce.py --runs=sao=/tmp/sao_vs_gspo/sao-seed0,gspo=/tmp/sao_vs_gspo/gspo-seed0
"""
from launch import sweep as s

SEEDS = (0, 1, 2)


TOTAL_STEPS = 160  # equal RL budgets (the SAO toy's own default is 240, the GSPO toy's 160)


def get_sweep() -> list[s.Run]:
  grid = s.product(s.zip_(s.sweep("seed", SEEDS), s.sweep("learner.seed", SEEDS)), s.fixed(total_steps=TOTAL_STEPS))
  return (s.runs("sao", "experiments/configs/sao_openswe.py:toy", grid, name_keys=("seed",)) +
          s.runs("gspo", "experiments/configs/gspo_openswe.py:toy", grid, name_keys=("seed",)))
