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
The proxied SWE scaffolds (`openai_tools`, `bash_only`) are harnesses too (`sao_openswe.py:swe_toy` mixes them). The
full variant's names are the paper's external scaffolds, which this repository does not ship: a worker refuses them
with an error naming the registered harnesses until each is registered (`sao.rollout.harnesses.register`).

Toy (CPU):

    python experiments/train.py --config=experiments/configs/sao_mixed_harness.py:toy --workdir=/tmp/sao_mixed_toy

Full (needs an SGLang GPU fleet behind a router, a TPU/GPU trainer, the three scaffolds talking to the
token-capturing proxy (`sao.rollout.proxy`), and sandboxes; see `launch/tpu_pod.py`):

    python experiments/train.py --config=experiments/configs/sao_mixed_harness.py:full \
        --workdir=gs://.../sao_mixed_harness --config.engine_urls="('http://<router-host>:30000',)" \
        --config.learner.critic.init_path=gs://.../value_checkpoint
"""
from experiments.configs import common
from experiments.configs import sao_multilingual

VARIANTS = ("toy", "full")

TOY_HARNESSES = ("xml_json", "json_block", "function_call")
FULL_HARNESSES = ("openhands_sdk", "claude_code", "opencode")


def get_config(arg: str | None = None):
  variant, overrides = common.parse_arg(arg, VARIANTS)
  config = sao_multilingual.get_config(variant).copy_and_resolve_references()
  config.unlock()
  config.name = f"sao_mixed_harness_{variant}"
  if variant == "toy":
    # Number search: three syntaxes of the same tool calls, so the mixture is the only thing that changes.
    base = common.base_config()
    config.env = base.env
    config.rollout.max_new_tokens = base.rollout.max_new_tokens
    config.rollout.max_turns = base.rollout.max_turns
    config.rollout.max_total_tokens = base.rollout.max_total_tokens
    harnesses = TOY_HARNESSES
  else:
    harnesses = FULL_HARNESSES  # validation stays on OpenHands SDK (`env.kwargs.harness`, from sao_multilingual)
  config.rollout.harnesses = harnesses
  config.rollout.harness_weights = tuple(1.0 for _ in harnesses)  # equal configured weights
  config.rollout.eval_harness = harnesses[0]
  return common.finalize(config, overrides)
