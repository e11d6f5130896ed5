r"""SAO, the stabilized recipe (../shared/REFERENCE.md): critic warm start + 20 warmup steps, critic clip 10, K = 2,
whitened advantages, DIS window (0.2, 4.0), one rollout per task.

Toy (CPU, a few minutes; supervised warm start → value pretraining → SAO on number search):

    python experiments/train.py --config=experiments/configs/sao_openswe.py:toy --workdir=/tmp/sao_toy

Full (the paper's setting; needs an SGLang GPU fleet and a TPU/GPU trainer):

    python experiments/train.py --config=experiments/configs/sao_openswe.py:full --workdir=gs://.../sao_openswe \
        --config.engine_urls=http://router:30000
"""
from experiments.configs import common

VARIANTS = ("toy", "full")


def get_config(arg: str | None = None):
  variant, overrides = common.parse_arg(arg, VARIANTS)
  config = common.base_config()
  config.name = f"sao_openswe_{variant}"
  c = config.learner
  c.algorithm = "sao"
  c.sao.critic_warmup_steps = 20
  c.sao.critic_epochs = 2
  c.sao.whiten_advantages = True
  c.sao.dis_ratio_low, c.sao.dis_ratio_high = 0.2, 4.0
  c.actor.optimizer.clip_norm = 1.0
  c.critic.optimizer.clip_norm = 10.0
  if variant == "full":
    config.model.init = "hf"
    config.model.hf_path = "Qwen/Qwen3.5-35B-A3B"  # a local copy of the HF checkpoint
    config.env.name = "swe"
    config.env.kwargs = {}
    config.total_steps = 300
    config.recipe.sft_steps = 0
    config.recipe.value_pretrain_steps = 0  # the critic comes from an earlier trained value checkpoint instead
    c.critic.init = "checkpoint"
    c.critic.init_path = "value_checkpoint"  # an earlier run's `value_init` or final critic
    c.critic.frozen_params = (".*self_attn.*", ".*linear_attn.*", ".*visual.*")
    c.actor.optimizer.learning_rate = 1e-6
    c.critic.optimizer.learning_rate = 5e-6
    c.batching.bucket_lengths = (32768, 65536, 131072)
    c.batching.micro_batch_size = 8
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
    config.rollout.batch_size = 64  # 64 tasks × 1 rollout per step
    config.rollout.max_new_tokens = 8192
    config.rollout.max_turns = 200
    config.rollout.max_total_tokens = 131072
    config.rollout.eval_every = 20
    config.rollout.lease_ttl_s = 7200.0
    config.rollout.concurrency = 64
    config.server.host = "0.0.0.0"
    config.server.max_staleness = 8
  return common.finalize(config, overrides)
