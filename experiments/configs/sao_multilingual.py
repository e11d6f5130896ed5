r"""SAO on multilingual bug fixing (the write-up's first "additional application"): the stabilized recipe with a
trained critic and whitened advantages, trained on multilingual bug-fix tasks through one harness (OpenHands SDK),
validated on the 300 tasks of SWE-bench Multilingual. Reported: 53.0 % → best 57.0 % (final 54.33 %).

Toy (CPU): the same recipe on `code_repair` (fix the planted bug in a short program; run the tests; submit):

    python experiments/train.py --config=experiments/configs/sao_multilingual.py:toy --workdir=/tmp/sao_multilingual_toy

Full (needs an SGLang GPU fleet behind a router, a TPU/GPU trainer, the `swe` environment's sandboxes, and the data:
one SWE-bench-format JSONL holding the multilingual bug-fix training tasks and SWE-bench Multilingual's 300 tasks,
with local repository snapshots, at `data/swe_bench_multilingual/` or wherever `env.kwargs.jsonl` and
`env.kwargs.snapshot_root` point; the `swe` env splits the JSONL by repository, so validation runs on the
repositories the split holds out rather than on exactly the 300 named tasks. Without the data the run stops before
starting anything, naming the missing file. The harness is the registered OpenHands-style `openai_tools` scaffold,
standing in for the OpenHands SDK; see `launch/tpu_pod.py`):

    python experiments/train.py --config=experiments/configs/sao_multilingual.py:full \
        --workdir=gs://.../sao_multilingual --config.engine_urls="('http://<router-host>:30000',)" \
        --config.env.kwargs.jsonl=/data/multilingual.jsonl --config.env.kwargs.snapshot_root=/data/snapshots \
        --config.learner.critic.init_path=gs://.../value_checkpoint
"""
from experiments.configs import common

VARIANTS = ("toy", "full")


def get_config(arg: str | None = None):
  variant, overrides = common.parse_arg(arg, VARIANTS)
  config = common.base_config()
  config.name = f"sao_multilingual_{variant}"
  common.stabilized_sao(config)
  if variant == "toy":
    config.total_steps = common.SAO_TOY_RL_STEPS
    common.code_repair_toy(config)
  else:
    common.full_scale(config)
    common.sao_full_critic(config)  # a trained critic (an earlier run's final critic)
    common.swe_multilingual_data(config)
    # One harness, OpenHands-style function calling: the registered `openai_tools` scaffold stands in for the
    # OpenHands SDK (an external program this repository does not ship).
    common.harness_mixture(config, ("openai_tools",))
  return common.finalize(config, overrides)
