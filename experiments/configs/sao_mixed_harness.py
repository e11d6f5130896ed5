r"""SAO with a mixture of training harnesses (the write-up's second "additional application"): OpenHands SDK, Claude
Code and OpenCode sampled at equal configured weights, the stabilized recipe with a trained critic and whitened
advantages, validated through OpenHands SDK on the 300 SWE-bench Multilingual tasks. Reported: 51.0 % → best
61.67 % (final 57.0 %, last five evaluations 57.6 %).

The mixture is `rollout.harnesses` (names) with `rollout.harness_weights` (relative sampling weights, normalised by
the worker); `rollout.eval_harness` is the one validation runs through. The worker picks each training episode's
harness at the weights, deterministically per (seed, lease group, sample); demonstrations for the warm start are
played through the same mixture; metrics carry `reward/harness/<name>` and `validation/harness/<name>`. On the toy
scale a "harness" is an agent-loop format / tool-call syntax for the same number-search tasks
(`sao.rollout.harnesses.syntaxes`):
- `xml_json`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen style, the chat template's own);
- `json_block`: a fenced ```json {"name": ..., "arguments": {...}}``` block;
- `function_call`: a Python-style call `compare(guess=32)`.
At full scale the mixture is the proxied SWE scaffolds this repository registers, `openai_tools` (OpenHands-style
function calling, validation's harness) and `bash_only` (mini-swe-agent style), at equal weights. The paper's three
(OpenHands SDK, Claude Code, OpenCode) are external programs this repository does not ship; register each as a
proxied harness (`sao.rollout.harnesses.register`) and name them with
`--config.rollout.harnesses="('openhands_sdk', 'claude_code', 'opencode')"` (plus `rollout.harness_weights` and
`rollout.eval_harness`); unregistered names stop the run before it starts, listing the registered ones. The data is
`sao_multilingual.py:full`'s (see there).

Toy (CPU):

    python experiments/train.py --config=experiments/configs/sao_mixed_harness.py:toy --workdir=/tmp/sao_mixed_toy

Full (needs an SGLang GPU fleet behind a router, a TPU/GPU trainer, sandboxes and the data; see
`launch/tpu_pod.py`):

    python experiments/train.py --config=experiments/configs/sao_mixed_harness.py:full \
        --workdir=gs://.../sao_mixed_harness --config.engine_urls="('http://<router-host>:30000',)" \
        --config.env.kwargs.jsonl=/data/multilingual.jsonl --config.env.kwargs.snapshot_root=/data/snapshots \
        --config.learner.critic.init_path=gs://.../value_checkpoint
"""
from experiments.configs import common

VARIANTS = ("toy", "full")

TOY_HARNESSES = ("xml_json", "json_block", "function_call")
FULL_HARNESSES = common.SWE_SCAFFOLDS  # the registered stand-ins for the paper's external scaffolds (docstring)


def get_config(arg: str | None = None):
  variant, overrides = common.parse_arg(arg, VARIANTS)
  config = common.base_config()
  config.name = f"sao_mixed_harness_{variant}"
  common.stabilized_sao(config)
  if variant == "toy":
    # Number search: three syntaxes of the same tool calls, so the mixture is the only thing that changes.
    config.total_steps = common.SAO_TOY_RL_STEPS
    common.harness_mixture(config, TOY_HARNESSES)
  else:
    common.full_scale(config)
    common.sao_full_critic(config)
    common.swe_multilingual_data(config)
    common.harness_mixture(config, FULL_HARNESSES)  # validated through the first, `openai_tools`
  return common.finalize(config, overrides)
