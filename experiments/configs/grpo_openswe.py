r"""GRPO, the second group baseline (Shao et al. 2024; docs/algorithm.md, "GRPO"): G = 8 rollouts per task,
group-normalised advantages `(r − mean_g r)/(std_g r + 1e-6)` on every token of the sequence, the token-level PPO
clip (1 − 0.2, 1 + 0.2) with token-mean aggregation, no critic (so no value pretraining), no KL term.

Toy (CPU; supervised warm start → 160 GRPO steps on number search, 8 tasks × 8 rollouts per step, at the GSPO
toy's constant actor LR 2e-4):

    python experiments/train.py --config=experiments/configs/grpo_openswe.py:toy --workdir=/tmp/grpo_toy

Full (64 tasks × 8 = 512 trajectories per step, as the GSPO baseline; needs an SGLang GPU fleet and a TPU/GPU
trainer):

    python experiments/train.py --config=experiments/configs/grpo_openswe.py:full --workdir=gs://.../grpo_openswe \
        --config.engine_urls=http://router:30000
"""
from experiments.configs import common

VARIANTS = ("toy", "full")


def get_config(arg: str | None = None):
  variant, overrides = common.parse_arg(arg, VARIANTS)
  config = common.base_config()
  config.name = f"grpo_openswe_{variant}"
  common.grpo(config)
  if variant == "full":
    common.full_scale(config)
    config.rollout.batch_size = 512  # 64 tasks × 8 rollouts per step
    config.server.buffer_capacity = 1024  # two steps' worth of groups
  return common.finalize(config, overrides)
