r"""SAO's stabilized recipe on `search_chain` (sao.rollout.envs.search_chain), the toy task where the critic matters:
five number searches in a row (ranges 1..8 to 1..15) on one shared budget of 22 turns, a 0/1 reward for the whole
chain, and observations that carry the slack (turns left minus binary search's worst case for the rest) — how
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
  # 8^5 = 32,768 plans of 5 rounds, one target tuple each; 60 / 20 / 20 % of the plans train / validate / test.
  config.env.kwargs = dict(sizes=tuple(range(8, 16)), rounds=5, spare_turns=2, targets_per_plan=1)
  config.env.num_validation_tasks = 128  # 128 distinct held-out plans per evaluation: SE ≈ 0.04
  # An episode is ≈ 20 turns of ≈ 24 tokens (≈ 500 tokens, 120 of them actions): 5× number search's.
  config.rollout.max_turns = 24  # above the env's own 22-turn budget, which ends every episode first
  config.rollout.max_total_tokens = 640
  config.rollout.base_eval_repeats = 2  # 2 × 128 episodes for the base policy
  config.recipe.num_demonstrations = 1000  # ≈ 70 ms each to tokenise
  config.recipe.sft_steps = 300
  config.total_steps = 100
  config.learner.batching.bucket_lengths = (256, 320, 384, 448, 512, 576, 640)
  return common.finalize(config, overrides)
