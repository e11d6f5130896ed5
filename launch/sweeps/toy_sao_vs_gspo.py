r"""SAO (1 rollout per task, learned critic) vs GSPO (groups of G, no critic) on the toy, 3 seeds each.

    python -m launch.local --sweep=launch/sweeps/toy_sao_vs_gspo.py --workdir=/tmp/sao_vs_gspo --max_parallel=1
    python experiments/reproduce.py --runs=sao=/tmp/sao_vs_gspo/sao-seed0,gspo=/tmp/sao_vs_gspo/gspo-seed0
"""
from launch import sweep as s

SEEDS = (0, 1, 2)


def get_sweep() -> list[s.Run]:
  seeds = s.zip_(s.sweep("seed", SEEDS), s.sweep("learner.seed", SEEDS))
  return (s.runs("sao", "experiments/configs/sao_openswe.py:toy", seeds, name_keys=("seed",)) +
          s.runs("gspo", "experiments/configs/gspo_openswe.py:toy", seeds, name_keys=("seed",)))
