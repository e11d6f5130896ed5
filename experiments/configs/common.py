"""The parts every experiment config shares: the run layout, the toy recipe, and argument parsing.

An experiment config is `get_config(arg)` returning one locked `ml_collections.ConfigDict`; `arg` is a variant name
optionally followed by comma-separated `key=value` overrides of top-level scalar knobs, big_vision style
(`sao_openswe.py:toy`, `sao_openswe.py:toy,total_steps=50`; tuple knobs take `+`-separated items:
`toy,engine_urls=http://a:30000+http://b:30000`). `--config.<key>=<value>` flags work as well.
"""
from __future__ import annotations

import ml_collections

from sao.train.config import default_learner_config


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


def resolve_key(config: ml_collections.ConfigDict, dotted: str) -> tuple[ml_collections.ConfigDict, str]:
  """(the node holding `dotted`'s last part, that part); KeyError naming `dotted` if any part is missing."""
  node = config
  *path, leaf = dotted.split(".")
  for key in path:
    if key not in node or not isinstance(node[key], (ml_collections.ConfigDict, dict)):
      raise KeyError(dotted)
    node = node[key]
  if leaf not in node:
    raise KeyError(dotted)
  return node, leaf


def apply_overrides(config: ml_collections.ConfigDict, overrides: dict[str, str]) -> None:
  """Sets dotted keys from strings, converting to the existing value's type; unknown keys are errors."""
  for dotted, text in overrides.items():
    try:
      node, leaf = resolve_key(config, dotted)
    except KeyError:
      raise ValueError(f"config arg: unknown key {dotted!r}") from None
    current = node[leaf]
    if isinstance(current, (tuple, list)):
      items = [v for v in text.split("+") if v]  # `engine_urls=http://a:1+http://b:2`
      # Items take the type of the current items (`sizes=8+9+10` gives ints); an empty default stays strings.
      kind = type(current[0]) if current and isinstance(current[0], (int, float)) else str
      try:
        value = tuple(kind(v) for v in items)
      except ValueError as e:
        raise ValueError(f"config arg: {dotted}={text!r}: items must be {kind.__name__}s") from e
    elif isinstance(current, bool):
      value = text.lower() in ("1", "true", "yes")
    elif isinstance(current, int):
      value = int(text)
    elif isinstance(current, float):
      value = float(text)
    else:
      value = text
    node[leaf] = value


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
      num_workers=1,
      jax_distributed=False,  # multi-host trainer: call jax.distributed.initialize() first
      total_steps=160,  # RL steps (after value pretraining)
      log_every=1,  # a progress line per step
      checkpoint_every=50,
      critic_trace_every=10,  # SAO: dump one success + one failure with per-token critic values (0 = off)
      keep_policy_exports=3,
      model=dict(
          init="toy",  # toy: a fresh tiny model warm-started on demonstrations | hf: load hf_path
          hf_path="",
          tokenizer_path="",  # "" = the built-in toy tokenizer (toy) / hf_path (hf)
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
          # validation then pays for (README, "The toy run").
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
      ),
      server=dict(host="127.0.0.1", port=0, token_env="SAO_TRAINER_TOKEN", buffer_capacity=512, max_staleness=4,
                  max_outstanding=0,  # leased + buffered samples; 0 = 2 batches, so staleness stays ~1
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
  c.batching.bucket_lengths = (64, 128, 160, 192, 256, 512)
  return config


def finalize(config: ml_collections.ConfigDict, overrides: dict[str, str]) -> ml_collections.ConfigDict:
  apply_overrides(config, overrides)
  config.learner.seed = config.seed  # one seed per run: `seed=1` reseeds tasks, demonstrations and the learner
  if not config.server.max_outstanding:
    config.server.max_outstanding = 2 * config.rollout.batch_size
  config.learner.actor.optimizer.total_steps = max(config.total_steps, config.learner.actor.optimizer.warmup_steps + 1)
  config.learner.critic.optimizer.total_steps = max(config.total_steps + config.recipe.value_pretrain_steps,
                                                    config.learner.critic.optimizer.warmup_steps + 1)
  config.lock()
  return config
