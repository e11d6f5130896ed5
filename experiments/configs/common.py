"""The pieces every experiment config is built from, big_vision `configs/common.py` style.

An experiment file is one flat `get_config(arg)`: `base_config()` (every knob, toy defaults), then the pieces that
make the experiment (a recipe: `stabilized_sao`, `initial_sao`, `gspo`; a scale: `full_scale` + `sao_full_critic`,
`swe_toy`, `code_repair_toy`; data: `swe_multilingual_data`), then its own few settings, then `finalize`. No config
reads another experiment's finished config.

`arg` is a variant name optionally followed by comma-separated `key=value` overrides of any existing dotted key
(`sao_openswe.py:toy`, `sao_openswe.py:toy,total_steps=50,learner.sao.critic_epochs=3`; tuple knobs take
`+`-separated items: `toy,engine_urls=http://a:30000+http://b:30000`; booleans are `true`/`false`).
`--config.<key>=<value>` flags work the same (config_flags applies them after `get_config`): the derived fields
(`learner.seed`, the optimisers' `total_steps`, `server.max_outstanding`) are FieldReferences that follow `seed`,
`total_steps`, `recipe.value_pretrain_steps` and `rollout.batch_size` either way.
"""
from __future__ import annotations

import ml_collections

from sao import run_config
from sao.engines import compilation_cache
from sao.train.config import default_learner_config

from experiments.configs import pod_layout

# The paper's base policy (a local copy of the HF checkpoint; override `model.hf_path`).
FULL_MODEL = "Qwen/Qwen3.5-35B-A3B"
# The router `launch/tpu_pod.py` starts in front of the SGLang fleet; override with --config.engine_urls.
ROUTER_URL = "http://sglang-router:30000"
# Validation still rose after 160 RL steps with the decaying actor LR (docs/results.md, runs P and R): +28 points over
# the base policy's after 240 (the GSPO toy keeps the shared 160).
SAO_TOY_RL_STEPS = 240
# The proxied SWE scaffolds this repository registers (`sao.rollout.harnesses`): the OpenHands-style function-calling
# `openai_tools` and the mini-swe-agent-style `bash_only`.
SWE_SCAFFOLDS = ("openai_tools", "bash_only")


def parse_arg(arg: str | None, variants: tuple[str, ...], default: str = "toy") -> tuple[str, dict[str, str]]:
  """`"toy,total_steps=5"` -> ("toy", {"total_steps": "5"}). Unknown variants are an error naming them."""
  parts = [p for p in (arg or default).split(",") if p]
  variant, overrides = parts[0], {}
  if variant not in variants:
    raise ValueError(f"config arg: unknown variant {variant!r}; expected one of {variants}")
  for part in parts[1:]:
    if "=" not in part:
      raise ValueError(f"config arg: {part!r} is not key=value")
    key, value = part.split("=", 1)
    overrides[key] = value
  return variant, overrides


def apply_overrides(config: ml_collections.ConfigDict, overrides: dict[str, str]) -> None:
  """Sets dotted keys from strings, typed like the values they replace (`sao.run_config.apply_overrides`)."""
  run_config.apply_overrides(config, overrides)


def base_config() -> ml_collections.ConfigDict:
  """Every knob of a run with the toy defaults; experiment files override what differs."""
  learner = default_learner_config()
  learner.unlock()
  config = ml_collections.ConfigDict(dict(
      name="",
      seed=0,
      role="embedded",  # embedded: trainer + local engine + worker on this machine | trainer | worker
      engine_urls=(),  # external SGLang servers (or routers); empty = start local JAX engines
      num_engines=1,
      # Rows a local engine lets wait for a batch (`sao.engines.serve --max_queued_rows`; 4096 is its default); a
      # request beyond it gets HTTP 503 and the workers back off. Not used with `engine_urls`.
      engine_max_queued_rows=4096,
      num_workers=1,
      jax_distributed=False,  # multi-host trainer on a TPU pod: jax.distributed.initialize() detects the cluster
      # A trainer job of several processes with explicit coordinates (CPU hosts, `python -m launch.local
      # --trainer_processes=P`): process 0's "host:port", the job's size and this process's id (docs/tpu.md).
      distributed=dict(coordinator_address="", num_processes=1, process_id=0,
                       heartbeat_timeout_s=30.0,  # a process silent this long stops the job, naming it
                       # The progress watchdog (sao.train.coordination): a process longer than this budget plus
                       # `stall_step_factor` × its longest finished phase in one update, export or checkpoint stalls
                       # the job, which exits naming every process's phase. The budget covers a first compile.
                       stall_compile_budget_s=1800.0, stall_step_factor=5.0,
                       # SIGTERM stops a trainer at its next step boundary (with a checkpoint in the RL phase); one
                       # still running this long after it exits (sao.train.stop_signal).
                       stop_grace_s=120.0),
      total_steps=160,  # RL steps (after value pretraining)
      log_every=1,  # a progress line per step
      checkpoint_every=50,
      critic_trace_every=10,  # SAO: dump one success + one failure with per-token critic values (0 = off)
      keep_policy_exports=3,
      # True: each new policy version reaches the engines in the background while the next step trains
      # (sao.train.publication; `full_scale` sets it, where a publish takes tens of seconds). The toy waits for
      # every engine to serve it: in the background its validation after 240 steps fell 0.78 → 0.75 over 6 / 10
      # runs and 3 of 5 seed-0 runs drifted into padding every turn (docs/performance_job.md).
      async_publish=False,
      # Threads of XLA:CPU's pools in the trainer process and in each local engine (0: one per core). The toy's
      # trainer, engine and worker share a few cores: one-thread pools spend less CPU per step
      # (sao.engines.xla_cpu_threads).
      xla_cpu_threads=1,
      # JAX's persistent compilation cache of the trainer and the local engines, shared by every run that names the
      # same directory: a run after the first loads the executables it would compile (sao.engines.compilation_cache;
      # "" = this run's <workdir>/jax_cache). Each of its directories is bounded; least recently used entries go.
      compilation_cache_dir=compilation_cache.default_dir(),
      compilation_cache_max_gb=4.0,
      model=dict(
          init="toy",  # toy: a fresh tiny model warm-started on demonstrations | hf: load hf_path
          hf_path="",
          tokenizer_path="",  # "" = the built-in toy tokenizer (toy) / hf_path (hf)
          # Precision (`sao.models.config.ModelConfig` fields): parameters stored in `param_dtype`, activations and
          # matmul inputs in `compute_dtype`; norms, router, softmax statistics, log-probs and losses are float32
          # whatever these say. The optimizer state is float32 either way; `learner.<role>.optimizer.master_weights`
          # adds a float32 master copy of the trainable params (`sao.train.optim`).
          param_dtype="float32",
          compute_dtype="float32",
          remat="none",  # per-decoder-layer rematerialisation (`sao.models.config.REMAT_POLICIES`)
          # Training and scoring run the decoder layers as one `lax.scan` over periods of layer kinds (same param
          # tree; `sao.models.scan`): compile time stays that of one period whatever the depth (docs/models.md).
          scan_layers=False,
          # MoE under expert parallelism: a shard runs its own rows in chunks of this × its balanced share of the
          # gathered rows (one chunk when they fit; nothing dropped; sao.models.moe). 0: every gathered row at once.
          moe_capacity_factor=0.0,
          # Gated DeltaNet's chunk matmuls: "float32" (f32 at HIGHEST precision) or "bfloat16" (bf16 operands, f32
          # accumulation and state, as flash-linear-attention computes them; sao.models.gated_deltanet).
          linear_attn_matmul="float32",
          # Under a mesh with `tensor` > 1: the residual stream's tokens split over `tensor` (the projections' weights
          # gathered, the mixers' heads reached by all-to-alls) instead of its hidden units (sao.models.sequence_parallel).
          sequence_parallel=False,
          toy=dict(model_type="qwen3", hidden_size=64, intermediate_size=192, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16, max_position_embeddings=1024,
                   # Untied: with tied embeddings an RL step on a guess's output logit also moves that number's input
                   # embedding, which the tokens after it read; the toy runs' format broke down that way.
                   tie_word_embeddings=False),
      ),
      env=dict(
          name="number_search",
          # Ranges 1..8 to 1..16 with exactly binary search's worst-case number of turns (no spare: a wasted guess
          # usually fails the episode): 108 tasks; observations carry the remaining interval (a Markov state for the
          # tiny policy). Whole ranges are held out (`split_by="range"`): training on 1..9, 1..10, 1..11, 1..15,
          # 1..16 (61 tasks), validating on 1..8 and 1..13 (21), testing on 1..12 and 1..14 (26). Holding out
          # targets of the training ranges instead rewards a search biased towards the training targets, which
          # validation then pays for (docs/results.md).
          kwargs=dict(n=16, sizes=tuple(range(8, 17)), offsets=(0,), show_interval=True, spare_turns=0,
                      split_fractions=(0.5, 0.3, 0.2), split_by="range"),
          num_train_tasks=4096,  # the training task list (the split's pool, cycled)
          num_validation_tasks=128,  # episodes per evaluation (the 21 validation tasks, cycled): SE ≈ 0.04
      ),
      recipe=dict(
          num_demonstrations=2000,
          demonstration_noise=0.5,  # the scripted expert's error rate per turn: a weak base policy, not an expert
          sft_steps=400,  # enough for the tiny model to learn the midpoint rule as its mode (the plateau breaks ~300)
          sft_batch_size=32,
          sft_learning_rate=3e-3,
          value_pretrain_steps=10,  # critic-only steps on base rollouts, saved and loaded as the warm start
      ),
      rollout=dict(
          batch_size=64,  # trajectories per learner step (GSPO: groups × group_size)
          group_size=1,  # SAO: 1 rollout per task; GSPO/GRPO: G
          concurrency=64,  # agent loops per worker
          max_new_tokens=16,
          max_turns=16,
          max_total_tokens=192,
          lease_ttl_s=120.0,
          eval_every=10,  # validate every this many policy versions
          eval_temperature=1.0,  # validation samples at the training temperature
          # The base policy's validation (the reference every later one is compared with) runs the validation list
          # this many times: 4 × 128 episodes, SE ≈ 0.02 instead of 0.04.
          base_eval_repeats=4,
          # The harness mixture (`sao.rollout.harnesses`): each training episode's harness is picked at these
          # relative weights (empty: equal); validation runs through `eval_harness` ("": the first). No names: the
          # chat template's own tool-call format (`xml_json`).
          harnesses=(),
          harness_weights=(),
          eval_harness="",
      ),
      server=dict(host="127.0.0.1", port=0, token_env="SAO_TRAINER_TOKEN", buffer_capacity=512, max_staleness=4,
                  max_outstanding=0,  # leased + buffered samples; 0 = 2 batches, so staleness stays ~1
                  # max_outstanding that follows the learner's log-prob mismatch (sao.transport.staleness_control):
                  # ×shrink above `high`, +grow (0: a batch) after `calm_updates` below `low`, never under a batch
                  adaptive_staleness=dict(enabled=False, signal="actor/logprob_mismatch", high=0.03, low=0.01,
                                          shrink=0.5, grow=0, calm_updates=3, min_outstanding=0),
                  # Submissions outside these ranges are rejected (sao.transport.admission says why -80).
                  max_abs_reward=1e4, min_logprob=-80.0),
      learner=learner,
  ))
  c = config.learner
  c.actor.optimizer.learning_rate = 4e-4  # 6e-4 learned faster but broke down transiently in one of two runs
  c.actor.optimizer.warmup_steps = 10
  # Cosine to 0.1·lr: at a constant 3e-4 one 200-step run collapsed from step ≈ 155 (log-prob mismatch 0.005 →
  # 0.24 in 6 updates, response length 20 → 55 tokens, reward → 0); the decayed runs stayed smooth, learned as much.
  c.actor.optimizer.schedule = "cosine"
  c.actor.optimizer.end_lr_fraction = 0.1
  c.critic.optimizer.learning_rate = 1e-3
  c.critic.optimizer.warmup_steps = 10
  c.critic.frozen_params = (".*self_attn.*", ".*linear_attn.*", ".*visual.*")  # every token mixer (hybrids too)
  # The learner sorts each batch's rows by length into 16 groups, each padded to its own bucket (the same update on ≈ 40
  # % fewer tokens; docs/performance_learner.md "The main job's update"). The buckets fit the toy's lengths (37, 57, 77,
  # 97–103, 116–121 tokens: ≈ 20-token turns) with few shapes: each bucket a batch reaches compiles the steps once.
  c.batching.bucket_lengths = (64, 80, 104, 128, 176, 256, 512)
  c.batching.length_groups = 16  # 4 rows each: 317 CPU ms per update (8 groups: 392, 4: 646, one batch: 1288)
  # Compiling every shape's programs ahead (during the warm start) cost the 2-core machine more than the stalls it
  # removed (docs/performance_learner.md "The main job's update"); with idle cores,
  # `--config.learner.batching.precompile=True`.
  c.batching.precompile = False
  return config



# ---------------------------------------------------------------------------------------------------------- recipes

def stabilized_sao(config: ml_collections.ConfigDict) -> None:
  """SAO's stabilized recipe (docs/algorithm.md): 20 critic warmup steps, K = 2 critic epochs, whitened
  advantages, DIS window (0.2, 4.0), actor clip 1, critic clip 10; one rollout per task (the base default)."""
  c = config.learner
  c.algorithm = "sao"
  c.sao.critic_warmup_steps = 20
  c.sao.critic_epochs = 2
  c.sao.whiten_advantages = True
  c.sao.dis_ratio_low, c.sao.dis_ratio_high = 0.2, 4.0
  c.actor.optimizer.clip_norm = 1.0
  c.critic.optimizer.clip_norm = 10.0


def initial_sao(config: ml_collections.ConfigDict) -> None:
  """The write-up's initial critic recipe, on top of `stabilized_sao`: no critic warm start (the policy backbone with
  a fresh value head, no value pretraining), 10 critic warmup steps, critic clip 1, no advantage whitening."""
  c = config.learner
  c.sao.critic_warmup_steps = 10
  c.critic.optimizer.clip_norm = 1.0
  c.sao.whiten_advantages = False
  config.recipe.value_pretrain_steps = 0  # no warm start: the critic is not pretrained ...
  c.critic.init = "policy"  # ... it is the policy backbone with a fresh value head
  c.critic.init_path = ""


def gspo(config: ml_collections.ConfigDict) -> None:
  """GSPO: G = 8 rollouts per task, sequence ratios clipped to (1 - 3e-4, 1 + 4e-4), no critic."""
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


def grpo(config: ml_collections.ConfigDict) -> None:
  """GRPO (Shao et al. 2024; docs/algorithm.md, "GRPO"): G = 8 rollouts per task, group advantages
  `(r − mean_g r)/(std_g r + 1e-6)`, the token-level PPO clip (1 − 0.2, 1 + 0.2) with token-mean aggregation, no
  critic, no KL term (DeepSeekMath's KL penalty needs a reference model this learner does not keep)."""
  c = config.learner
  c.algorithm = "grpo"  # the learner's `_update_group` with the `ppo_clip` actor loss (its default for grpo)
  c.actor_loss = ""
  c.group.normalize_std = True  # GRPO's std-normalised advantages (False would be Dr. GRPO)
  c.ppo.clip_low, c.ppo.clip_high = 0.2, 0.2  # PPO's ε = 0.2 (Schulman et al. 2017; docs/algorithm.md)
  c.actor.optimizer.clip_norm = 1.0  # as the SAO and GSPO recipes (docs/algorithm.md's recipe table)
  config.recipe.value_pretrain_steps = 0  # no critic
  config.rollout.group_size = 8  # G = 8, GSPO's: equal rollouts per task for the two group baselines
  config.rollout.batch_size = 64  # 8 tasks × 8 rollouts, the SAO toy's 64 trajectories per step
  # The GSPO toy's constant 2e-4 (at 4e-4 GSPO collapsed at RL step ≈ 60). With one update per batch the token clip
  # never binds either (the ratio is 1 at the start of the only step), so GRPO has GSPO's exposure to a too-high rate.
  c.actor.optimizer.learning_rate = 2e-4
  c.actor.optimizer.schedule = "constant"


# ----------------------------------------------------------------------------------------------------------- scales

FULL_MAX_TURNS = 200  # model turns per SWE episode: the agent loop's and the env's limit (tens, up to ~100 seen)

def full_scale(config: ml_collections.ConfigDict) -> None:
  """The paper's scale (an SGLang GPU fleet, a TPU/GPU trainer): the HF base policy, the SWE environment, 128k-token
  episodes of up to 200 turns, the paper's actor optimiser (1e-6 after 10 warmup steps, constant), remote workers."""
  c = config.learner
  config.model.init = "hf"
  config.model.hf_path = FULL_MODEL
  config.env.name = "swe"
  config.env.kwargs = dict(max_turns=FULL_MAX_TURNS)  # the env's own default (30) would end episodes first
  config.total_steps = 300
  config.recipe.sft_steps = 0
  config.xla_cpu_threads = 0  # the trainer owns its host; the engines are SGLang's
  config.async_publish = True  # the next step trains while the fleet loads a 70 GB policy (docs/fleet.md)
  c.actor.optimizer.learning_rate = 1e-6
  c.actor.optimizer.schedule = "constant"  # 10 warmup steps (the base's), then constant (the toy decays)
  c.batching.bucket_lengths = (32768, 65536, 131072)
  c.batching.length_groups = 0  # one [B, T] program per bucket: the shapes compile_tpu.py compiles ahead of time
  # 1,024-token chunks make the LM head compute-bound on a chip (128 re-read the unembedding per chunk, memory-bound):
  # the v5p-128 slice's step 0.644 → 0.462 s (docs/tpu_hlo_breakdown.md, "The LM head").
  c.logprob_chunk_size = 1024
  pod_layout.full_precision(config)
  pod_layout.full_mesh(config)
  config.rollout.max_new_tokens = 8192
  config.rollout.max_turns = FULL_MAX_TURNS
  config.rollout.max_total_tokens = 131072
  config.rollout.eval_every = 20
  config.rollout.base_eval_repeats = 1  # the validation split is hundreds of SWE tasks
  config.rollout.lease_ttl_s = 7200.0
  config.rollout.concurrency = 64
  config.server.host = "0.0.0.0"  # remote workers must reach the trainer
  config.server.max_staleness = 8


def sao_full_critic(config: ml_collections.ConfigDict) -> None:
  """SAO at full scale: the critic is loaded from an earlier run's value checkpoint (no value pretraining here)."""
  c = config.learner
  config.recipe.value_pretrain_steps = 0
  c.critic.init = "checkpoint"
  c.critic.init_path = "value_checkpoint"  # an earlier run's `value_init` or final critic
  c.critic.optimizer.learning_rate = 5e-6
  config.rollout.batch_size = 64  # 64 tasks × 1 rollout per step


def swe_toy(config: ml_collections.ConfigDict) -> None:
  """The SWE-style environment at CPU scale: the toy model with a long context, few short episodes, through the
  proxied scaffolds `SWE_SCAFFOLDS` at equal weights (validated through the first)."""
  config.env.name = "swe"
  # Generated repositories (a planted bug each); short sandboxed commands and observations: toy contexts are a few
  # thousand byte-level tokens.
  config.env.kwargs = dict(num_repos=240, max_turns=8, command_timeout_s=10.0, max_output_bytes=800,
                           test_timeout_s=60.0)
  config.env.num_train_tasks = 1024
  config.env.num_validation_tasks = 8
  config.model.toy.max_position_embeddings = 8192
  config.recipe.num_demonstrations = 32
  config.recipe.demonstration_noise = 0.2
  config.recipe.sft_steps = 60
  config.recipe.sft_batch_size = 4
  config.recipe.value_pretrain_steps = 5
  config.total_steps = 30
  config.rollout.batch_size = 8
  config.rollout.concurrency = 8
  config.rollout.max_new_tokens = 384  # an expert edit written as a python heredoc (bash_only) is ~300 tokens
  config.rollout.max_turns = 8
  config.rollout.max_total_tokens = 6144
  config.rollout.eval_every = 10
  config.rollout.base_eval_repeats = 1  # sandboxed episodes with test runs are the slow part
  harness_mixture(config, SWE_SCAFFOLDS)
  config.learner.batching.bucket_lengths = (1536, 2048, 3072, 4096, 6144)
  config.learner.batching.micro_batch_size = 1  # [T, T] attention scores of thousands of tokens: one row at a time


def code_repair_toy(config: ml_collections.ConfigDict) -> None:
  """`code_repair` at CPU scale: fix the planted bug in a short program; run the tests; submit."""
  config.env.name = "code_repair"
  config.env.kwargs = dict(max_turns=8, timeout_s=2.0)
  config.env.num_validation_tasks = 64
  # A code_repair episode (view, edit, run_tests, submit) is ≈ 450 tokens with edits of ≈ 25 tokens.
  config.rollout.max_new_tokens = 32
  config.rollout.max_turns = 8
  config.rollout.max_total_tokens = 512


# ------------------------------------------------------------------------------------------------ data and harnesses

def swe_multilingual_data(config: ml_collections.ConfigDict) -> None:
  """SWE-bench-Multilingual-style data for the `swe` environment: one SWE-bench JSONL (training tasks and the
  evaluation tasks together) plus local repository snapshots; the env splits it by repository (no repository is in
  two splits). The default paths hold nothing until the data is prepared there: the run stops before it starts
  anything, with an error naming the file; point the config at the data with `--config.env.kwargs.jsonl=<file>
  --config.env.kwargs.snapshot_root=<dir>` (`sao.rollout.envs.swe.dataset` documents both formats)."""
  config.engine_urls = (ROUTER_URL,)
  config.env.name = "swe"
  config.env.kwargs = dict(jsonl=MULTILINGUAL_JSONL, snapshot_root=MULTILINGUAL_SNAPSHOTS,
                           max_turns=config.rollout.max_turns)
  config.env.num_validation_tasks = 300


MULTILINGUAL_JSONL = "data/swe_bench_multilingual/instances.jsonl"
MULTILINGUAL_SNAPSHOTS = "data/swe_bench_multilingual/snapshots"


def harness_mixture(config: ml_collections.ConfigDict, names: tuple[str, ...], eval_harness: str = "") -> None:
  """Training episodes through `names` at equal configured weights; validation through `eval_harness` (default: the
  first)."""
  config.rollout.harnesses = tuple(names)
  config.rollout.harness_weights = tuple(1.0 for _ in names)
  config.rollout.eval_harness = eval_harness or names[0]


def finalize(config: ml_collections.ConfigDict, overrides: dict[str, str]) -> ml_collections.ConfigDict:
  apply_overrides(config, overrides)
  # Derived settings are FieldReferences, so `--config.seed=1`, `--config.total_steps=160` and
  # `--config.rollout.batch_size=8` (applied by config_flags after this function returns) reach them too. Setting a
  # derived key itself (`--config.server.max_outstanding=100`) replaces the derivation; `learner.seed` and `seed` are
  # one value (setting either sets both).
  config.learner.seed = config.get_ref("seed")  # one seed per run: tasks, demonstrations and the learner
  if not config.server.max_outstanding:
    config.server.max_outstanding = config.rollout.get_ref("batch_size") * 2
  config.learner.actor.optimizer.total_steps = config.get_ref("total_steps")
  config.learner.critic.optimizer.total_steps = config.get_ref("total_steps") + config.recipe.get_ref(
      "value_pretrain_steps")
  config.lock()
  return config
