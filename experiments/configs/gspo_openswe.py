r"""GSPO, the group baseline: G = 8 rollouts per task, sequence-level importance ratios clipped to
(1 - 3e-4, 1 + 4e-4), group-normalised advantages, no critic (so no value pretraining).

Toy (CPU, a few minutes; supervised warm start → GSPO on number search, 8 tasks × 8 rollouts per step):

    python experiments/train.py --config=experiments/configs/gspo_openswe.py:toy --workdir=/tmp/gspo_toy

Full (the paper's baseline; 64 tasks × 8 = 512 trajectories per step; needs an SGLang GPU fleet and a TPU/GPU
trainer):

    python experiments/train.py --config=experiments/configs/gspo_openswe.py:full --workdir=gs://.../gspo_openswe \
        --config.engine_urls=http://router:30000
"""
from experiments.configs import common

VARIANTS = ("toy", "full")


def get_config(arg: str | None = None):
  variant, overrides = common.parse_arg(arg, VARIANTS)
  config = common.base_config()
  config.name = f"gspo_openswe_{variant}"
  common.gspo(config)
  if variant == "full":
    common.full_scale(config)
    config.rollout.batch_size = 512  # 64 tasks × 8 rollouts per step
    config.server.buffer_capacity = 1024  # two steps' worth of groups
  return common.finalize(config, overrides)
