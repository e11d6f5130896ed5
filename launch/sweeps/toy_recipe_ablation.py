r"""The critic-recipe ablation on the toy: initial (no warm start, warmup 10, clip 1, no whitening) vs stabilized
(value pretraining warm start, warmup 20, clip 10, whitening), 3 seeds each.

    python -m launch.local --sweep=launch/sweeps/toy_recipe_ablation.py --workdir=/tmp/recipe_ablation
    python experiments/reproduce.py \
        --runs=sao_initial=/tmp/recipe_ablation/initial-seed0,sao=/tmp/recipe_ablation/stabilized-seed0
"""
from launch import sweep as s

SEEDS = (0, 1, 2)


def get_sweep() -> list[s.Run]:
  seeds = s.zip_(s.sweep("seed", SEEDS), s.sweep("learner.seed", SEEDS))
  return (s.runs("initial", "experiments/configs/sao_openswe_initial.py:toy", seeds, name_keys=("seed",)) +
          s.runs("stabilized", "experiments/configs/sao_openswe.py:toy", seeds, name_keys=("seed",)))
