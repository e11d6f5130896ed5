"""The learner's configuration: one `ml_collections.ConfigDict` with every knob, and its validation.

`default_learner_config()` returns a locked ConfigDict (assigning an unknown attribute raises). Experiments override
fields and call `validate_learner_config(config)`, which rejects unknown keys, wrong types and out-of-range values
with a `ValueError` naming the dotted key (e.g. `actor.optimizer.learning_rate`). Defaults follow docs/algorithm.md's
stabilized SAO recipe (SWE/coding settings).
"""
from __future__ import annotations

import json
import re
from typing import Any

import ml_collections

from sao.models.mesh_axes import MESH_AXES
from sao.train import micro_batching

ALGORITHMS = ("sao", "gspo", "grpo")
SCHEDULES = ("constant", "cosine")
CRITIC_INITS = ("policy", "checkpoint")
RATIO_BASES = ("trainer", "rollout")
CRITIC_TARGET_CORRECTIONS = ("none", "vtrace")  # sao.train.critic_correction
ACTOR_STARTS = ("steps", "critic_ev")  # sao.train.actor_start


def _optimizer(learning_rate: float, clip_norm: float) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      learning_rate=learning_rate,
      warmup_steps=10,  # linear LR warmup from 0
      schedule="constant",  # after warmup: constant | cosine (to `end_lr_fraction`·lr at total_steps)
      total_steps=1000,
      end_lr_fraction=0.0,
      weight_decay=0.0,  # AdamW decoupled decay, applied to matrices (ndim ≥ 2) only
      b1=0.9,
      b2=0.999,
      eps=1e-8,
      clip_norm=clip_norm,  # global-norm clipping over the role's trainable params; 0 disables
      master_weights=False,  # keep a float32 master copy of the trainable params (for bf16 params; sao.train.optim)
  ))


def default_learner_config() -> ml_collections.ConfigDict:
  """Every learner knob with its default (see the module docstring)."""
  config = ml_collections.ConfigDict(dict(
      algorithm="sao",  # sao (single rollout + critic, DIS) | gspo | grpo (group advantages, no critic)
      seed=0,
      # A loss registered in `sao.train.actor_losses`; "" = the algorithm's own (sao: dis, gspo: gspo, grpo: ppo_clip).
      actor_loss="",
      temperature=1.0,  # rollout sampling temperature; trainer log-probs use the same tempered softmax
      sao=dict(
          gamma=1.0,
          lambda_critic=1.0,  # critic targets: Monte-Carlo returns
          lambda_policy_alpha=1.5,  # policy λ_b = 1 − 1/(α·l_b)
          lambda_policy=0.0,  # 0 = the length-adaptive λ_b above; in (0, 1]: this fixed policy λ for every sequence
          whiten_advantages=True,
          critic_epochs=2,  # K critic steps per actor update
          critic_warmup_steps=20,  # first updates train the critic only
          dis_ratio_low=0.2,
          dis_ratio_high=4.0,
          tis_cap=2.0,  # actor_loss "tis": weight min(π_train/π_rollout, C)
          icepop_ratio_low=0.5,  # actor_loss "icepop": tokens with π_train/π_rollout outside [low, high] masked
          icepop_ratio_high=5.0,
          # Critic targets: "none" = GAE(r, V⁰, γ, λ_critic) + V⁰ (today's); "vtrace" = V-trace with the truncated
          # per-token ratios π_θ/π_rollout (ρ̄ = vtrace_rho_bar, c̄ = vtrace_c_bar) over the action tokens
          critic_target_correction="none",
          vtrace_rho_bar=1.0,
          vtrace_c_bar=1.0,
          # When the actor starts: "steps" = after `critic_warmup_steps` updates (today's); "critic_ev" = once the
          # critic's pre-update explained variance, averaged over the last `actor_start_ev_window` updates, reaches
          # `actor_start_ev_threshold`, and at the latest at update `actor_start_max_steps`
          actor_start="steps",
          actor_start_ev_threshold=0.3,
          actor_start_ev_window=5,
          actor_start_max_steps=100,
      ),
      gspo=dict(clip_low=3e-4, clip_high=4e-4),
      ppo=dict(clip_low=0.2, clip_high=0.2),
      group=dict(normalize_std=True),  # False = Dr. GRPO
      # π_old for the GSPO/GRPO ratio: the trainer's own log-probs before this update (one update per batch makes the
      # ratio 1 at the start), or the rollout engine's.
      ratio_base="trainer",
      actor=dict(
          optimizer=_optimizer(1e-6, 1.0),
          frozen_params=(),  # regexes over param paths like "model/layers_0/self_attn/q_proj/kernel"
      ),
      critic=dict(
          optimizer=_optimizer(5e-6, 10.0),
          frozen_params=(".*self_attn.*", ".*linear_attn.*", ".*visual.*"),
          init="policy",  # policy: actor backbone + fresh value head | checkpoint: `init_path` (save_critic output)
          init_path="",
          value_clip=0.0,  # PPO value clipping around the pre-update values; 0 disables
      ),
      batching=dict(
          micro_batch_size=0,  # rows per gradient-accumulation micro-batch (global); 0 = the whole batch at once
          # per padded length: "<max length>:<rows>,…" overrides micro_batch_size up to each length
          # (sao.train.micro_batching; e.g. "8192:64,32768:16"); "" = micro_batch_size everywhere
          micro_batch_by_length="",
          bucket_lengths=(32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768),
          pad_batch_to=0,  # pad B up to this many rows (a fixed shape despite dropped trajectories); 0 = off
          # >0: each step sorts the rows by length into this many groups, each padded only to its own bucket (the
          # same update, less padding; `batching.length_groups`); 0 = one [B, T] batch
          length_groups=0,
          # The trainer compiles the update's programs for every batch shape in a thread (`Learner.precompile`), so no
          # update stalls compiling a shape it meets first: during the supervised warm start into the persistent
          # compilation cache when there is one, else beside the run as it builds a learner
          # (docs/performance_learner.md)
          precompile=True,
      ),
      mesh=dict(data=1, fsdp=-1, expert=1, tensor=1),  # sao.models.mesh_axes.MESH_AXES; −1 = the remaining devices
      logprob_chunk_size=128,  # time chunk of the fused unembedding + log-softmax
      # MoE routing replay (R3): workers ask the engines for SGLang's routed experts, trajectories carry them, and the
      # actor's log-probs route each recorded token to the engine's experts (gates from the trainer's router;
      # `sao.models.moe.replay_route`, docs/models.md). Off: the trainer's own top-k.
      routing_replay=False,
      nan_guard_limit=3,  # consecutive non-finite updates (per role) before the run stops
      checkpoint=dict(max_to_keep=3, async_save=True),  # how often: the run's `checkpoint_every`
  ))
  config.lock()
  return config


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
  out = {}
  for key, value in tree.items():
    name = f"{prefix}{key}"
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      out.update(_flatten(value, name + "."))
    else:
      out[name] = value
  return out


def _check_type(name: str, value: Any, default: Any) -> None:
  if isinstance(default, bool):
    ok = isinstance(value, bool)
  elif isinstance(default, int):
    ok = isinstance(value, int) and not isinstance(value, bool)
  elif isinstance(default, float):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
  elif isinstance(default, str):
    ok = isinstance(value, str)
  elif isinstance(default, (tuple, list)):
    ok = isinstance(value, (tuple, list))
  else:
    ok = True
  if not ok:
    raise ValueError(f"learner config: {name} must be a {type(default).__name__}, got {value!r}")


def validate_learner_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Checks keys, types and ranges against `default_learner_config()`; returns `config`. Raises ValueError."""
  defaults = _flatten(default_learner_config())
  given = _flatten(config)
  for name in given:
    if name not in defaults:
      raise ValueError(f"learner config: unknown key {name!r}")
  for name in defaults:
    if name not in given:
      raise ValueError(f"learner config: missing key {name!r}")
  for name, value in given.items():
    _check_type(name, value, defaults[name])
  c = config

  def choice(name, value, options):
    if value not in options:
      raise ValueError(f"learner config: {name} must be one of {options}, got {value!r}")

  def positive(name, value, allow_zero=False):
    if not (value >= 0 if allow_zero else value > 0):
      raise ValueError(f"learner config: {name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")

  choice("algorithm", c.algorithm, ALGORITHMS)
  choice("ratio_base", c.ratio_base, RATIO_BASES)
  if c.actor_loss:
    # Imported here: the registry's losses import JAX, and experiment configs (which import this module) must load
    # without it (sweeps, launchers, the worker's flags).
    from sao.train import actor_losses  # pylint: disable=g-import-not-at-top
    choice("actor_loss", c.actor_loss, actor_losses.names())
  choice("critic.init", c.critic.init, CRITIC_INITS)
  if c.critic.init == "checkpoint" and not c.critic.init_path:
    raise ValueError("learner config: critic.init_path is required when critic.init == 'checkpoint'")
  positive("temperature", c.temperature)
  if not 0.0 < c.sao.gamma <= 1.0:
    raise ValueError(f"learner config: sao.gamma must be in (0, 1], got {c.sao.gamma!r}")
  if not 0.0 <= c.sao.lambda_critic <= 1.0:
    raise ValueError(f"learner config: sao.lambda_critic must be in [0, 1], got {c.sao.lambda_critic!r}")
  positive("sao.lambda_policy_alpha", c.sao.lambda_policy_alpha)
  if not 0.0 <= c.sao.lambda_policy <= 1.0:
    raise ValueError(f"learner config: sao.lambda_policy must be 0 (length-adaptive) or in (0, 1], got "
                     f"{c.sao.lambda_policy!r}")
  positive("sao.critic_epochs", c.sao.critic_epochs)
  positive("sao.critic_warmup_steps", c.sao.critic_warmup_steps, allow_zero=True)
  if not 0.0 <= c.sao.dis_ratio_low < 1.0 < c.sao.dis_ratio_high:
    raise ValueError(f"learner config: sao.dis_ratio_low/high must satisfy 0 <= low < 1 < high, got "
                     f"({c.sao.dis_ratio_low}, {c.sao.dis_ratio_high})")
  positive("sao.tis_cap", c.sao.tis_cap)
  if not 0.0 <= c.sao.icepop_ratio_low < 1.0 < c.sao.icepop_ratio_high:
    raise ValueError(f"learner config: sao.icepop_ratio_low/high must satisfy 0 <= low < 1 < high, got "
                     f"({c.sao.icepop_ratio_low}, {c.sao.icepop_ratio_high})")
  choice("sao.critic_target_correction", c.sao.critic_target_correction, CRITIC_TARGET_CORRECTIONS)
  positive("sao.vtrace_rho_bar", c.sao.vtrace_rho_bar)
  positive("sao.vtrace_c_bar", c.sao.vtrace_c_bar)
  choice("sao.actor_start", c.sao.actor_start, ACTOR_STARTS)
  if not c.sao.actor_start_ev_threshold <= 1.0:
    raise ValueError(f"learner config: sao.actor_start_ev_threshold must be <= 1 (explained variance is at most 1), "
                     f"got {c.sao.actor_start_ev_threshold!r}")
  positive("sao.actor_start_ev_window", c.sao.actor_start_ev_window)
  positive("sao.actor_start_max_steps", c.sao.actor_start_max_steps, allow_zero=True)
  for name in ("gspo.clip_low", "gspo.clip_high", "ppo.clip_low", "ppo.clip_high"):
    positive(name, given[name], allow_zero=True)
  for role in ("actor", "critic"):
    o = c[role].optimizer
    positive(f"{role}.optimizer.learning_rate", o.learning_rate, allow_zero=True)
    positive(f"{role}.optimizer.warmup_steps", o.warmup_steps, allow_zero=True)
    choice(f"{role}.optimizer.schedule", o.schedule, SCHEDULES)
    positive(f"{role}.optimizer.total_steps", o.total_steps)
    if not 0.0 <= o.end_lr_fraction <= 1.0:
      raise ValueError(f"learner config: {role}.optimizer.end_lr_fraction must be in [0, 1]")
    positive(f"{role}.optimizer.weight_decay", o.weight_decay, allow_zero=True)
    for b in ("b1", "b2"):
      if not 0.0 <= o[b] < 1.0:
        raise ValueError(f"learner config: {role}.optimizer.{b} must be in [0, 1), got {o[b]!r}")
    positive(f"{role}.optimizer.eps", o.eps)
    positive(f"{role}.optimizer.clip_norm", o.clip_norm, allow_zero=True)
    for i, pattern in enumerate(c[role].frozen_params):
      if not isinstance(pattern, str):
        raise ValueError(f"learner config: {role}.frozen_params[{i}] must be a regex string, got {pattern!r}")
      try:
        re.compile(pattern)
      except re.error as e:
        raise ValueError(f"learner config: {role}.frozen_params[{i}] is not a valid regex: {e}") from e
  positive("critic.value_clip", c.critic.value_clip, allow_zero=True)
  positive("batching.micro_batch_size", c.batching.micro_batch_size, allow_zero=True)
  micro_batching.parse(c.batching.micro_batch_size, c.batching.get("micro_batch_by_length", ""))
  positive("batching.pad_batch_to", c.batching.pad_batch_to, allow_zero=True)
  positive("batching.length_groups", c.batching.length_groups, allow_zero=True)
  buckets = tuple(c.batching.bucket_lengths)
  if not buckets or any(not isinstance(b, int) or b < 2 for b in buckets) or list(buckets) != sorted(set(buckets)):
    raise ValueError(f"learner config: batching.bucket_lengths must be strictly increasing ints >= 2, got {buckets}")
  sizes = [c.mesh[a] for a in MESH_AXES]
  if any(s == 0 or s < -1 for s in sizes) or sizes.count(-1) > 1:
    raise ValueError(f"learner config: mesh sizes must be positive or a single -1, got {dict(zip(MESH_AXES, sizes))}")
  positive("logprob_chunk_size", c.logprob_chunk_size)
  positive("nan_guard_limit", c.nan_guard_limit)
  positive("checkpoint.max_to_keep", c.checkpoint.max_to_keep)
  return config


def config_to_json(config: ml_collections.ConfigDict) -> str:
  """A deterministic JSON dump (tuples become lists), stored in checkpoints."""
  return json.dumps(config.to_dict(), sort_keys=True, default=list)


def config_from_json(text: str) -> ml_collections.ConfigDict:
  """Inverse of `config_to_json` (lists back to tuples), validated."""
  config = default_learner_config()
  data = json.loads(text)

  def assign(target, values, prefix=""):
    for key, value in values.items():
      if key not in target:
        raise ValueError(f"learner config: unknown key {prefix + key!r}")
      if isinstance(value, dict):
        assign(target[key], value, prefix + key + ".")
      else:
        target[key] = tuple(value) if isinstance(value, list) else value

  assign(config, data)
  return validate_learner_config(config)
