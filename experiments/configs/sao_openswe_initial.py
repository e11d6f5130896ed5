r"""SAO, the write-up's *initial* recipe (docs/algorithm.md, "The recipes"): no critic warm start (the
critic starts from the policy backbone with a fresh value head, no value pretraining), 10 critic warmup steps,
critic gradient clipping 1, no advantage whitening. Otherwise as `sao_openswe.py` (K = 2, DIS window (0.2, 4.0)).
The write-up's initial run kept earning reward while its turn count exploded; this config reproduces that ablation.

Toy (CPU; supervised warm start → SAO on number search, no value pretraining):

    python experiments/train.py --config=experiments/configs/sao_openswe_initial.py:toy --workdir=/tmp/sao_initial_toy

Full (needs an SGLang GPU fleet behind a router and a TPU/GPU trainer; see `launch/tpu_pod.py`):

    python experiments/train.py --config=experiments/configs/sao_openswe_initial.py:full \
        --workdir=gs://.../sao_openswe_initial --config.engine_urls="('http://<router-host>:30000',)"
"""
from experiments.configs import common

VARIANTS = ("toy", "full")


def get_config(arg: str | None = None):
  variant, overrides = common.parse_arg(arg, VARIANTS)
  config = common.base_config()
  config.name = f"sao_openswe_initial_{variant}"
  common.stabilized_sao(config)  # as sao_openswe.py, ...
  if variant == "toy":
    config.total_steps = common.SAO_TOY_RL_STEPS
  else:
    common.full_scale(config)
    common.sao_full_critic(config)
  common.initial_sao(config)  # ... with the initial critic recipe
  return common.finalize(config, overrides)
