"""The registry of actor losses: name → loss function, the batch keys it reads, its hyper-parameters from the config.

One entry is everything the learner needs to train with a loss, so adding one (a new clip rule) is one
`@register(...)` here (the math itself goes to `sao.core.losses`) plus its test; `learner.actor_loss` then selects it
(empty: the algorithm's own, `DEFAULT_FOR_ALGORITHM`). As tunix's `function_registry`:

    @actor_losses.register("my_loss", batch_keys=(*BASE_KEYS, "rollout_logprobs", "advantages"),
                           hparams=lambda config: {"low": config.sao.dis_ratio_low})
    def my_loss(logprobs, batch, *, low):           # logprobs [B, T], differentiated
      ...
      return loss_sum, {"my_fraction": Mean(count, tokens)}

A loss returns its *unnormalised* `loss_sum` (the step divides the micro-batch sum once by the full batch's
`denominator(action_mask)`, which makes gradient accumulation exact) and a dict of `clu.metrics` metrics that merge
across micro-batches (`Mean`: summed numerator and count, divided once at the end).

Batch keys come from what the learner builds (`sao.train.batching.FIELDS`) plus `advantages` (`[B, T]`, SAO: from the
critic) or `seq_advantages` (`[B]`, GSPO/GRPO: group-normalised rewards).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import flax
import jax
import jax.numpy as jnp
from clu import metrics as clu_metrics

from sao.core import losses

BASE_KEYS = ("input_ids", "attention_mask", "action_mask")  # every actor step reads these ([B, T])
DEFAULT_FOR_ALGORITHM = {"sao": "dis", "gspo": "gspo", "grpo": "ppo_clip"}


@flax.struct.dataclass
class Mean(clu_metrics.Average):
  """`clu.metrics.Average` of `total / count` that reads 0 (not NaN) when nothing was counted."""

  def compute(self) -> jax.Array:
    return self.total / jnp.maximum(self.count, 1.0)


def token_count(action_mask: jax.Array) -> jax.Array:
  """`N = max(Σ m, 1)`: the denominator of token-mean losses ([B, T] mask → scalar float32)."""
  return jnp.maximum(jnp.sum(action_mask.astype(bool), dtype=jnp.float32), 1.0)


def sequence_count(action_mask: jax.Array) -> jax.Array:
  """`G = max(#rows with an action token, 1)`: the denominator of sequence-mean losses (GSPO)."""
  return jnp.maximum(jnp.sum(jnp.any(action_mask.astype(bool), axis=-1), dtype=jnp.float32), 1.0)


LossFn = Callable[..., tuple[jax.Array, dict[str, clu_metrics.Metric]]]


@dataclasses.dataclass(frozen=True)
class ActorLoss:
  """One registered loss.

  fn: `fn(logprobs [B, T], batch, **hparams) -> (loss_sum, metrics)`; `batch` holds exactly `batch_keys`.
  batch_keys: the batch fields the step reads (`BASE_KEYS` and the loss's own).
  hparams: `learner config → {name: value}`, the keyword arguments `fn` gets (compile-time constants).
  denominator: `action_mask [B, T] → scalar`, the full batch's normaliser (`token_count` or `sequence_count`).
  """
  name: str
  fn: LossFn
  batch_keys: tuple[str, ...]
  hparams: Callable[[Any], dict[str, Any]]
  denominator: Callable[[jax.Array], jax.Array]

  @property
  def reads_rollout_logprobs(self) -> bool:
    return "rollout_logprobs" in self.batch_keys


_REGISTRY: dict[str, ActorLoss] = {}


def register(name: str, *, batch_keys: tuple[str, ...], hparams: Callable[[Any], Mapping[str, Any]] | None = None,
             denominator: Callable[[jax.Array], jax.Array] = token_count) -> Callable[[LossFn], LossFn]:
  """Decorator: registers `fn` as the actor loss `name` (a duplicate name is a ValueError)."""
  missing = [k for k in BASE_KEYS if k not in batch_keys]
  if missing:
    raise ValueError(f"actor loss {name!r}: batch_keys must include {BASE_KEYS}, missing {missing}")

  def decorator(fn: LossFn) -> LossFn:
    if name in _REGISTRY:
      raise ValueError(f"actor loss {name!r} is already registered")
    _REGISTRY[name] = ActorLoss(name, fn, tuple(batch_keys), lambda config: dict(hparams(config) if hparams else {}),
                                denominator)
    return fn

  return decorator


def unregister(name: str) -> None:
  """Removes a registered loss (tests and notebooks that register their own)."""
  get(name)
  del _REGISTRY[name]


def get(name: str) -> ActorLoss:
  if name not in _REGISTRY:
    raise ValueError(f"actor loss: unknown loss {name!r}; registered: {names()}")
  return _REGISTRY[name]


def names() -> tuple[str, ...]:
  return tuple(_REGISTRY)


def _old_logprobs(logprobs: jax.Array, batch: Mapping[str, jax.Array], ratio_base: str) -> jax.Array:
  """π_old of the GSPO / PPO ratio: the trainer's own log-probs before this update, or the rollout engine's."""
  if ratio_base == "trainer":
    return jax.lax.stop_gradient(logprobs)
  if ratio_base == "rollout":
    return batch["rollout_logprobs"]
  raise ValueError(f"ratio_base: must be 'trainer' or 'rollout', got {ratio_base!r}")


# ------------------------------------------------------------------------------------------------ the shipped losses
@register("sft", batch_keys=BASE_KEYS)
def sft(logprobs, batch):
  """Masked token NLL `−(1/N) Σ m·logp` (the toy's supervised warm start)."""
  _, aux = losses.nll_loss(logprobs, batch["action_mask"])
  return aux["loss_sum"], {}


@register("dis", batch_keys=(*BASE_KEYS, "rollout_logprobs", "advantages"),
          hparams=lambda c: {"ratio_low": c.sao.dis_ratio_low, "ratio_high": c.sao.dis_ratio_high})
def dis(logprobs, batch, *, ratio_low, ratio_high):
  """SAO's DIS REINFORCE loss (`losses.dis_policy_loss`); reports `dis_masked_fraction`."""
  _, aux = losses.dis_policy_loss(logprobs, batch["rollout_logprobs"], batch["advantages"], batch["action_mask"],
                                  ratio_low, ratio_high)
  tokens = jnp.sum(batch["action_mask"].astype(bool), dtype=jnp.float32)
  return aux["loss_sum"], {"dis_masked_fraction": Mean(total=aux["masked_count"], count=tokens)}


@register("gspo", batch_keys=(*BASE_KEYS, "rollout_logprobs", "seq_advantages"), denominator=sequence_count,
          hparams=lambda c: {"clip_low": c.gspo.clip_low, "clip_high": c.gspo.clip_high, "ratio_base": c.ratio_base})
def gspo(logprobs, batch, *, clip_low, clip_high, ratio_base):
  """GSPO (`losses.gspo_policy_loss`); reports `clip_fraction` over sequences."""
  old = _old_logprobs(logprobs, batch, ratio_base)
  _, aux = losses.gspo_policy_loss(logprobs, old, batch["seq_advantages"], batch["action_mask"], clip_low, clip_high)
  sequences = jnp.sum(jnp.any(batch["action_mask"].astype(bool), axis=-1), dtype=jnp.float32)
  return aux["loss_sum"], {"clip_fraction": Mean(total=aux["clip_count"], count=sequences)}


@register("ppo_clip", batch_keys=(*BASE_KEYS, "rollout_logprobs", "seq_advantages"),
          hparams=lambda c: {"clip_low": c.ppo.clip_low, "clip_high": c.ppo.clip_high, "ratio_base": c.ratio_base})
def ppo_clip(logprobs, batch, *, clip_low, clip_high, ratio_base):
  """GRPO's token-level PPO clip (`losses.ppo_clip_policy_loss`); reports `clip_fraction` over tokens."""
  old = _old_logprobs(logprobs, batch, ratio_base)
  _, aux = losses.ppo_clip_policy_loss(logprobs, old, batch["seq_advantages"], batch["action_mask"], clip_low,
                                       clip_high)
  tokens = jnp.sum(batch["action_mask"].astype(bool), dtype=jnp.float32)
  return aux["loss_sum"], {"clip_fraction": Mean(total=aux["clip_count"], count=tokens)}


@register("tis", batch_keys=(*BASE_KEYS, "rollout_logprobs", "advantages"), hparams=lambda c: {"cap": c.sao.tis_cap})
def tis(logprobs, batch, *, cap):
  """Truncated importance sampling on SAO's token advantages (`losses.tis_policy_loss`, weight `min(k, C)`);
  reports `tis_truncated_fraction` and `tis_weight_mean`."""
  _, aux = losses.tis_policy_loss(logprobs, batch["rollout_logprobs"], batch["advantages"], batch["action_mask"], cap)
  tokens = jnp.sum(batch["action_mask"].astype(bool), dtype=jnp.float32)
  return aux["loss_sum"], {"tis_truncated_fraction": Mean(total=aux["truncated_count"], count=tokens),
                           "tis_weight_mean": Mean(total=aux["weight_sum"], count=tokens)}


@register("icepop", batch_keys=(*BASE_KEYS, "rollout_logprobs", "advantages"),
          hparams=lambda c: {"ratio_low": c.sao.icepop_ratio_low, "ratio_high": c.sao.icepop_ratio_high})
def icepop(logprobs, batch, *, ratio_low, ratio_high):
  """IcePop's masked importance sampling on SAO's token advantages (`losses.icepop_policy_loss`, weight k inside
  [α, β], 0 outside); reports `icepop_masked_fraction`."""
  _, aux = losses.icepop_policy_loss(logprobs, batch["rollout_logprobs"], batch["advantages"], batch["action_mask"],
                                     ratio_low, ratio_high)
  tokens = jnp.sum(batch["action_mask"].astype(bool), dtype=jnp.float32)
  return aux["loss_sum"], {"icepop_masked_fraction": Mean(total=aux["masked_count"], count=tokens)}
