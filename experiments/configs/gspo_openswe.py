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
  c = config.learner
  c.algorithm = "gspo"
  c.gspo.clip_low, c.gspo.clip_high = 3e-4, 4e-4
  c.actor.optimizer.clip_norm = 1.0
  config.recipe.value_pretrain_steps = 0  # no critic
  config.rollout.group_size = 8
  config.rollout.batch_size = 64  # 8 tasks × 8 rollouts
  # At the SAO toy's 4e-4 the toy GSPO run collapsed at RL step ≈ 60 (trainer/rollout log-prob mismatch 0.007 →
  # 0.55 in one step, reward → 0): with one update per batch the sequence clip never binds, and GSPO has no
  # token-level mask like SAO's DIS. Half that rate, constant (docs/results.md; the schedule of docs/algorithm.md).
  c.actor.optimizer.learning_rate = 2e-4
  c.actor.optimizer.schedule = "constant"
  if variant == "full":
    config.model.init = "hf"
    config.model.hf_path = "Qwen/Qwen3.5-35B-A3B"  # a local copy of the HF checkpoint
    config.env.name = "swe"
    config.env.kwargs = {}
    config.total_steps = 300
    config.recipe.sft_steps = 0
    c.actor.optimizer.learning_rate = 1e-6
    c.batching.bucket_lengths = (32768, 65536, 131072)
    c.batching.micro_batch_size = 8
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
    config.rollout.batch_size = 512  # 64 tasks × 8 rollouts per step
    config.rollout.max_new_tokens = 8192
    config.rollout.max_turns = 200
    config.rollout.max_total_tokens = 131072
    config.rollout.eval_every = 20
    config.rollout.base_eval_repeats = 1  # the validation split is 500 SWE-bench Verified tasks
    config.rollout.lease_ttl_s = 7200.0
    config.rollout.concurrency = 64
    config.server.host = "0.0.0.0"
    config.server.max_staleness = 8
    config.server.buffer_capacity = 1024  # two steps' worth of groups
  return common.finalize(config, overrides)
