r"""Does the critic matter? SAO on `search_chain` (`sao_search_chain.py:toy`) against the same run with its critic
frozen at initialisation (issue 48, item 1), 5 seeds per arm (seeds 0–2 are also `toy_chain_offpolicy`'s reference).

The frozen arm sets the critic's learning rate to 0: value pretraining and every critic epoch then leave it as the
trainer built it (the policy backbone with a fresh value head), so the actor's GAE advantages bootstrap on values
that never learn. The table: each arm's final validation on held-out plans (mean of the last three in-run
evaluations, and the re-measured final policy) and the difference, seed by seed, with intervals.

    python -m launch.local --sweep=launch/sweeps/toy_critic_matters.py --workdir=/tmp/toy_critic_matters \
        --max_parallel=1
    python experiments/paper/trim.py --sweep=toy_critic_matters --workdir=/tmp/toy_critic_matters --evaluate
    python experiments/reproduce.py --sweep=toy_critic_matters
"""
from launch import sweep as s

SEEDS = (0, 1, 2, 3, 4)
CONFIG = "experiments/configs/sao_search_chain.py:toy"
REFERENCE = "sao"

# arm -> (what changes, the overrides that change it)
FACTORS = {
    "frozen_critic": ("critic frozen at initialisation (learning rate 0)",
                      {"learner.critic.optimizer.learning_rate": 0.0}),
}

ANALYSIS = {
    "kind": "ablations",
    "reference": REFERENCE,
    "factors": {arm: what for arm, (what, _) in FACTORS.items()},
    "threshold_pct": 50.0,
}


def get_sweep() -> list[s.Run]:
  return s.ablation_runs(REFERENCE, CONFIG, SEEDS, FACTORS, by_seed=True)
