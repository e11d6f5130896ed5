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
from experiments.configs import sao_openswe

VARIANTS = ("toy", "full")


def apply_initial_recipe(config) -> None:
  """The initial critic recipe on top of a stabilized config (in place)."""
  c = config.learner
  c.sao.critic_warmup_steps = 10
  c.critic.optimizer.clip_norm = 1.0
  c.sao.whiten_advantages = False
  config.recipe.value_pretrain_steps = 0  # no warm start: the critic is not pretrained ...
  c.critic.init = "policy"  # ... it is the policy backbone with a fresh value head
  c.critic.init_path = ""


def get_config(arg: str | None = None):
  variant, overrides = common.parse_arg(arg, VARIANTS)
  config = sao_openswe.get_config(variant)  # locked; copy into an unlocked tree to edit
  config = config.copy_and_resolve_references()
  config.unlock()
  config.name = f"sao_openswe_initial_{variant}"
  apply_initial_recipe(config)
  return common.finalize(config, overrides)
