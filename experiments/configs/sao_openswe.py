r"""SAO, the stabilized recipe (docs/algorithm.md): critic warm start + 20 warmup steps, critic clip 10, K = 2,
whitened advantages, DIS window (0.2, 4.0), one rollout per task.

Toy (CPU, ~20 minutes on 2 cores; supervised warm start → value pretraining → 240 SAO steps on number search, whole
ranges held out for validation and test):

    python experiments/train.py --config=experiments/configs/sao_openswe.py:toy --workdir=/tmp/sao_toy

SWE toy (CPU, slow: a tiny model on the generated SWE-style repositories in bubblewrap sandboxes, driven through the
token-capturing proxy by the OpenHands-style `openai_tools` scaffold and the mini-swe-agent-style `bash_only`
scaffold at equal weights, validated through `openai_tools`; one scaffold only:
`swe_toy,rollout.harnesses=bash_only,rollout.harness_weights=1,rollout.eval_harness=bash_only`):

    python experiments/train.py --config=experiments/configs/sao_openswe.py:swe_toy --workdir=/tmp/sao_swe_toy

Full (the paper's setting; needs an SGLang GPU fleet and a TPU/GPU trainer):

    python experiments/train.py --config=experiments/configs/sao_openswe.py:full --workdir=gs://.../sao_openswe \
        --config.engine_urls=http://router:30000
"""
from experiments.configs import common

VARIANTS = ("toy", "full", "swe_toy")


def get_config(arg: str | None = None):
  variant, overrides = common.parse_arg(arg, VARIANTS)
  config = common.base_config()
  config.name = f"sao_openswe_{variant}"
  common.stabilized_sao(config)
  if variant == "toy":
    config.total_steps = common.SAO_TOY_RL_STEPS
  elif variant == "full":
    common.full_scale(config)
    common.sao_full_critic(config)
  elif variant == "swe_toy":
    common.swe_toy(config)
  return common.finalize(config, overrides)
