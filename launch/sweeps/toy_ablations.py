r"""One-factor ablations of the stabilized SAO toy recipe (issue 21, item 4), 3 seeds per arm.

Each arm changes one thing from `sao_openswe.py:toy` (critic warm start from 10 value-pretraining steps, 20 critic
warmup steps, critic clip 10, K = 2 critic epochs, whitened advantages, length-adaptive policy λ, critic token
mixers frozen); `FACTORS` names the config keys. The table: each arm's final validation (mean of the last three
in-run evaluations, and the re-measured final policy where `experiments/evaluate.py` ran) against the stabilized
arm's, seed by seed, with intervals.

    python -m launch.local --sweep=launch/sweeps/toy_ablations.py --workdir=/tmp/toy_ablations --max_parallel=1
    python experiments/paper/trim.py --sweep=toy_ablations --workdir=/tmp/toy_ablations --evaluate
    python experiments/reproduce.py --sweep=toy_ablations
"""
from launch import sweep as s

SEEDS = (0, 1, 2)
CONFIG = "experiments/configs/sao_openswe.py:toy"
REFERENCE = "stabilized"

# arm -> (what changes, the overrides that change it)
FACTORS = {
    "no_whitening": ("advantages not whitened", {"learner.sao.whiten_advantages": False}),
    "warmup0": ("critic warmup 0 (vs 20)", {"learner.sao.critic_warmup_steps": 0}),
    "warmup10": ("critic warmup 10 (vs 20)", {"learner.sao.critic_warmup_steps": 10}),
    "critic_clip1": ("critic gradient clip 1 (vs 10)", {"learner.critic.optimizer.clip_norm": 1.0}),
    # No value pretraining: the trainer then builds the critic from the policy backbone + a fresh value head
    # (`learner.critic.init = "policy"`, the toy's default), the initial recipe's cold critic.
    "cold_critic": ("no critic warm start (cold critic)", {"recipe.value_pretrain_steps": 0}),
    # The default freezes every token mixer (self_attn, linear_attn) and vision tower; here only the vision tower.
    "critic_attention": ("critic attention trainable", {"learner.critic.frozen_params": (".*visual.*",)}),
    "critic_epochs1": ("K = 1 critic epoch (vs 2)", {"learner.sao.critic_epochs": 1}),
    "fixed_lambda": ("fixed policy λ = 0.95 (vs length-adaptive)", {"learner.sao.lambda_policy": 0.95}),
}

ANALYSIS = {
    "kind": "ablations",
    "reference": REFERENCE,
    "factors": {arm: what for arm, (what, _) in FACTORS.items()},
    "threshold_pct": 60.0,
}


def get_sweep() -> list[s.Run]:
  return s.ablation_runs(REFERENCE, CONFIG, SEEDS, FACTORS)
