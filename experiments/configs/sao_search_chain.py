r"""SAO's stabilized recipe on `search_chain` (sao.rollout.envs.search_chain), the toy task where the critic matters:
four number searches in a row (a first range of 1..40 to 1..55, then three of 1..8 to 1..15) on one shared budget
of 22 turns, a 0/1 reward for the whole chain, and observations that carry the slack (turns left minus binary search's worst case for the rest) — how
promising the episode still is. Whole plans (sequences of ranges) are held out for validation and test.

Toy (CPU; supervised warm start → value pretraining → SAO):

    python experiments/train.py --config=experiments/configs/sao_search_chain.py:toy --workdir=/tmp/sao_chain

The same with the critic frozen at its initialisation (the policy backbone with a fresh value head: its learning
rate 0, so value pretraining and every critic epoch leave it as it was), the arm that shows the critic matters
(`launch/sweeps/toy_critic_matters.py`):

    python experiments/train.py --config=experiments/configs/sao_search_chain.py:toy \
        --config.learner.critic.optimizer.learning_rate=0 --workdir=/tmp/sao_chain_frozen
"""
from experiments.configs import common

VARIANTS = ("toy",)


def get_config(arg: str | None = None):
  variant, overrides = common.parse_arg(arg, VARIANTS)
  config = common.base_config()
  config.name = f"sao_search_chain_{variant}"
  common.stabilized_sao(config)
  config.env.name = "search_chain"
  # 16 × 8^3 = 8,192 plans of 4 rounds, one target tuple each; 60 / 20 / 20 % of the plans train / validate / test.
  # The first round's ranges (1..40 to 1..55, 6 guesses at worst) ask for numbers no later round uses (1..15, 4 at
  # worst): a skill of its own, whose outcome is known ≈ 12 turns later. Budget 6 + 3·4 + 4 = 22 turns (with 2
  # spare turns the warm-started policy validated at 5 % and neither arm learned in 90 RL steps, seed 0).
  config.env.kwargs = dict(sizes=tuple(range(8, 16)), first_sizes=tuple(range(40, 56)), rounds=4, spare_turns=4,
                           targets_per_plan=1)
  config.env.num_validation_tasks = 128  # 128 distinct held-out plans per evaluation: SE ≈ 0.04
  # An episode is ≈ 18–22 turns of ≈ 24 tokens (≈ 470–550 tokens, ≈ 110–130 of them actions).
  config.rollout.max_turns = 24  # above the env's own 22-turn budget, which ends every episode first
  config.rollout.max_total_tokens = 640
  config.rollout.batch_size = 32  # 32 episodes × 16 turns: 512 decisions per step (number search: 64 × 4)
  config.rollout.base_eval_repeats = 2  # 2 × 128 episodes for the base policy
  # The same number of supervised decisions as number search's warm start (200 × 16 episodes × 16 turns ≈ 400 × 32
  # × 4), in a quarter of the sequences: the tokens, not the decisions, are what cost.
  config.recipe.num_demonstrations = 500  # ≈ 60 ms each to tokenise
  config.recipe.sft_steps = 200
  config.recipe.sft_batch_size = 16
  # 20 critic-only updates before the actor's first: 10 of value pretraining, 10 of critic warmup.
  config.recipe.value_pretrain_steps = 10
  config.learner.sao.critic_warmup_steps = 10  # of 90 RL steps (the number-search toy: 20 of 240)
  config.total_steps = 90
  # At the number-search toy's 4e-4 (cosine) seed 0 declined from RL step ≈ 35: reward 0.31 → 0.13, entropy 0.44 →
  # 0.53, log-prob mismatch 0.01 → 0.06, responses longer; these episodes have 5× the action tokens.
  config.learner.actor.optimizer.learning_rate = 2e-4
  # The actor's advantages bootstrap on the critic over a few turns: a fixed λ = 0.95 per action token (≈ 0.74 per
  # turn of ≈ 6 action tokens; the outcome reaches the first round's guesses, ≥ 12 turns before the end, at weight
  # ≤ 0.03). The recipe's length-adaptive λ_b = 1 − 1/(1.5·l_b) is ≈ 0.994 here: Monte-Carlo returns minus a
  # baseline, where the critic only reduces variance. With bootstrapping a guess's credit is the change of value it
  # caused (the slack it cost), which only a critic that reads the slack can give; a frozen critic leaves the first
  # round's guesses without credit. At λ = 0.97 on plans whose rounds all have sizes 8..15 the frozen critic learned
  # as fast as SAO on seed 0 (docs/results.md): every round asks for the same skill, which the late turns' credit
  # teaches everywhere.
  config.learner.sao.lambda_policy = 0.95
  # The critic must read the slack from the last observation: with its token mixers frozen at the policy's (the
  # number-search toy's setting) its explained variance stayed at 0.00 ± 0.005 for 30 updates (values std 0.02: the
  # mean return everywhere), so here its attention trains too, from the first step (no LR warmup).
  config.learner.critic.frozen_params = (".*visual.*",)
  config.learner.critic.optimizer.warmup_steps = 0
  config.learner.batching.bucket_lengths = (384, 448, 512, 576, 640)
  config.learner.batching.length_groups = 8  # 4 rows each
  return common.finalize(config, overrides)
