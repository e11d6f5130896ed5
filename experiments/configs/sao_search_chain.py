r"""SAO's stabilized recipe on `search_chain` (sao.rollout.envs.search_chain), the toy task where the critic matters:
one number search (a range of 1..16 to 1..31), then ten trivial rounds (the range 1..1), on one shared budget of
17 turns, with a 0/1 reward for the whole chain. Every observation carries the slack (turns left minus binary
search's worst case for the rest), which is, after the search, the whole outcome: the ten rounds after it only
delay the reward. This is the shape of the key-to-door tasks of the credit-assignment literature: the decision, a
delay, then an outcome that only a critic reading the state can move back to the decision. Whole plans (here: the
first range size) are held out for validation and test.

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
  # 16 plans (a first range of 1..16 to 1..31, then ten rounds of 1..1), up to 64 target tuples each: 352 tasks;
  # 60 / 20 / 20 % of the plans train / validate / test (11 / 3 / 2 plans: validation on the first ranges 1..17,
  # 1..26, 1..27). The budget is 5 + 10 + 2 spare = 17 turns: a search that wastes more than 2 guesses has lost,
  # which the observations say (slack < 0) ten turns before the reward does.
  # Earlier versions (docs/history.md "search_chain: how the task got here"): four real rounds (a first of 40..55, then 8..15)
  # shared one skill across rounds 2–4, which the last turns' credit teaches everywhere, and a frozen critic learned
  # as well as SAO (seed 0 with 400 supervised steps: 21.5 → 31 % against SAO's 23.8 → 32 %).
  config.env.kwargs = dict(sizes=(1,), first_sizes=tuple(range(16, 32)), rounds=11, spare_turns=2,
                           targets_per_plan=64)
  config.env.num_validation_tasks = 128  # the 66 validation tasks, cycled: SE ≈ 0.04
  # An episode is ≈ 15–17 turns of ≈ 24 tokens (≈ 380–430 tokens, ≈ 90–100 of them actions).
  config.rollout.max_turns = 24  # above the env's own 17-turn budget, which ends every episode first
  config.rollout.max_total_tokens = 640
  config.rollout.batch_size = 32  # 32 episodes × ≈ 16 turns: ≈ 500 decisions per step (number search: 64 × 4)
  config.rollout.base_eval_repeats = 2  # 2 × 128 episodes for the base policy
  # 400 supervised steps, as number search's warm start (its plateau breaks at ≈ 300; on the earlier four-round task
  # 200 steps left the NLL on its plateau and the base policy guessing almost uniformly over a 40..55 range). The
  # warm-started policy validates at ≈ 50 % (seed 0, 2026-12-05).
  config.recipe.num_demonstrations = 500  # ≈ 60 ms each to tokenise
  config.recipe.sft_steps = 400
  config.recipe.sft_batch_size = 16
  # 20 critic-only updates before the actor's first: 10 of value pretraining, 10 of critic warmup.
  config.recipe.value_pretrain_steps = 10
  config.learner.sao.critic_warmup_steps = 10  # of 90 RL steps (the number-search toy: 20 of 240)
  config.total_steps = 90
  # At the number-search toy's 4e-4 (cosine) seed 0 declined from RL step ≈ 35: reward 0.31 → 0.13, entropy 0.44 →
  # 0.53, log-prob mismatch 0.01 → 0.06, responses longer; these episodes have 5× the action tokens.
  config.learner.actor.optimizer.learning_rate = 2e-4
  # The actor's advantages bootstrap on the critic over a few turns: a fixed λ = 0.95 per action token (≈ 0.74 per
  # turn of ≈ 6 action tokens; the outcome reaches the search's last guess, ten turns of ≈ 6 action tokens before
  # the end, at weight 0.95^60 ≈ 0.05). The recipe's length-adaptive λ_b = 1 − 1/(1.5·l_b) is ≈ 0.994 here:
  # Monte-Carlo returns minus a baseline, where the critic only reduces variance. With bootstrapping a guess's credit
  # is the change of value it caused (the slack it cost), which only a critic that reads the slack can give; a frozen
  # critic leaves the search without credit. At λ = 0.97 on plans whose rounds all have sizes 8..15 the frozen
  # critic learned as fast as SAO on seed 0 (docs/results_critic.md): every round asks for the same skill, which the late
  # turns' credit teaches everywhere.
  config.learner.sao.lambda_policy = 0.95
  # The critic must read the slack from the last observation: with its token mixers frozen at the policy's (the
  # number-search toy's setting) its explained variance stayed at 0.00 ± 0.005 for 30 updates (values std 0.02: the
  # mean return everywhere), so here its attention trains too, from the first step (no LR warmup).
  config.learner.critic.frozen_params = (".*visual.*",)
  config.learner.critic.optimizer.warmup_steps = 0
  config.learner.batching.bucket_lengths = (384, 448, 512, 576, 640)
  config.learner.batching.length_groups = 8  # 4 rows each
  return common.finalize(config, overrides)
