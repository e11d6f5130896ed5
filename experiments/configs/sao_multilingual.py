r"""SAO on multilingual bug fixing (the write-up's first "additional application"): the stabilized recipe with a
trained critic and whitened advantages, trained on multilingual bug-fix tasks through one harness (OpenHands SDK),
validated on the 300 tasks of SWE-bench Multilingual. Reported: 53.0 % → best 57.0 % (final 54.33 %).

Toy (CPU): the same recipe on `code_repair` (fix the planted bug in a short program; run the tests; submit):

    python experiments/train.py --config=experiments/configs/sao_multilingual.py:toy --workdir=/tmp/sao_multilingual_toy

Full (needs an SGLang GPU fleet behind a router, a TPU/GPU trainer, and the `swe` environment's sandboxes; see
`launch/tpu_pod.py`):

    python experiments/train.py --config=experiments/configs/sao_multilingual.py:full \
        --workdir=gs://.../sao_multilingual --config.engine_urls="('http://<router-host>:30000',)" \
        --config.learner.critic.init_path=gs://.../value_checkpoint
"""
from experiments.configs import common
from experiments.configs import sao_openswe

VARIANTS = ("toy", "full")

# The router `launch/tpu_pod.py` starts in front of the SGLang fleet; override with --config.engine_urls.
ROUTER_URL = "http://sglang-router:30000"


def get_config(arg: str | None = None):
  variant, overrides = common.parse_arg(arg, VARIANTS)
  config = sao_openswe.get_config(variant).copy_and_resolve_references()
  config.unlock()
  config.name = f"sao_multilingual_{variant}"
  if variant == "toy":
    config.env.name = "code_repair"
    config.env.kwargs = dict(max_turns=8, timeout_s=2.0)
    config.env.num_validation_tasks = 64
    # A code_repair episode (view, edit, run_tests, submit) is ≈ 450 tokens with edits of ≈ 25 tokens.
    config.rollout.max_new_tokens = 32
    config.rollout.max_turns = 8
    config.rollout.max_total_tokens = 512
  else:
    config.engine_urls = (ROUTER_URL,)
    config.env.kwargs = dict(
        train_dataset="multilingual_bugfix",  # multilingual bug-fix training tasks (repos in several languages)
        eval_dataset="SWE-bench/SWE-bench_Multilingual",  # 300 tasks, 42 repositories, 9 languages
        eval_split="test",
        harness="openhands_sdk",
    )
    config.env.num_validation_tasks = 300
    config.learner.critic.init_path = "value_checkpoint"  # a trained critic (an earlier run's final critic)
  return common.finalize(config, overrides)
