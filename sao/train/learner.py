"""The learner: actor (+ critic) state on a mesh and one `update(batch)` per training step.

SAO (`_update_sao`, docs/algorithm.md's stabilized recipe):
  1. V⁰ = critic(batch);  R = GAE(r, V⁰, γ, λ_critic) + V⁰ (γ = λ_critic = 1: Monte-Carlo returns, never whitened),
     or V-trace targets with `sao.critic_target_correction` (`sao.train.critic_correction`)
  2. K critic steps on ½(V − R)²
  3. V¹ = critic(batch);  A = GAE(r, V¹, γ, λ_b = 1 − 1/(α·l_b) or a fixed `sao.lambda_policy`);  A ← whiten_m(A)
     (config flag)
  4. one actor step with the DIS loss — skipped while `num_updates < critic_warmup_steps`, or with `sao.actor_start`
     = "critic_ev" until the critic's explained variance passes a threshold (`sao.train.actor_start`).
  With λ_critic = 1 and no value clip, R does not depend on V⁰ and the loss reads no old values: step 1's critic
  forward is skipped (unless the caller asks for V⁰, `update_traced`) and its diagnostics come from step 2's first
  forward, which runs the same params (`sao.train.critic_stats`).
GSPO / GRPO (`_update_group`): Â_i = group-normalised rewards, one actor step with the GSPO / PPO-clip loss.
The actor loss is `config.actor_loss` (a name in `sao.train.actor_losses`), by default the algorithm's own.
With `batching.length_groups` the batch's rows, sorted by length, are cut once into groups each padded only to its own
bucket, and the whole update runs group by group (`sao.train.grouped_update`: the steps are `grouped_steps.
GroupedStep`s, GAE runs per group, whitening and the metrics merge the groups' moments): the same update on fewer
padded tokens, queued by the host without waiting for any of its programs.

Multi-process (one process per host, `sao.train.distributed`): every process calls the same methods in the same order
with the same host batch; each feeds only its addressable shards (`_device`), and whatever comes back to the host
(metrics, traces, `actor_params_on_host`) is the same numpy values on every process.

Every jitted program that runs the model is a `steps.MeshJit`: traced under `jax.set_mesh(self.mesh)`, so the model
can lay out activations by mesh axis name (the routed MoE routes each batch shard's tokens on that shard); the
ahead-of-time compile report (`sao.aot.driver`) compiles the same objects.

Host-side counters: `num_updates` (every `update`, the warmup clock), `version` (applied actor updates: the policy
weights version engines are told about). The NaN guard lives in the jitted steps; consecutive skips are counted per
role (`sao.train.roles`, which also holds each role's params, shardings, optimizer and state) and `NonFiniteError`
is raised after `nan_guard_limit` in a row.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh

from sao.models.config import ModelConfig
from sao.models.transformer import abstract_params, init_critic_from_policy
from sao.train import actor_losses, batching, grouped_steps, roles, state as state_lib, steps
from sao.train import actor_start as actor_start_lib
from sao.train import checkpoint as ckpt_lib
from sao.train import critic_correction, critic_stats, routing_replay
from sao.train import distributed
from sao.train import grouped_update
from sao.train import learner_checkpoint
from sao.train import micro_batching
from sao.train import precompile as precompile_lib
from sao.train import targets
from sao.train import update_plan as update_plan_lib
from sao.train import mesh as mesh_lib
from sao.train import mesh_jit
from sao.train.mesh_jit import MeshJit
from sao.train.config import validate_learner_config
from sao.train.roles import NonFiniteError  # noqa: F401  (re-exported: callers catch it from here)
from sao.transport.trajectory import Trajectory


class Learner:
  """See the module docstring.

  Args:
    config: `default_learner_config()` with overrides (validated here).
    model_config: the policy architecture (the critic shares it, with a value head).
    actor_params: policy params `{'model', 'lm_head'?}` (host or device arrays; copied into the mesh shardings).
      None: an abstract learner — role states are `jax.ShapeDtypeStruct`s with their shardings, nothing is
      allocated or loaded, and the jitted programs can only be lowered (ahead-of-time compilation, `sao.aot.driver`).
    critic_params: critic params `{'model', 'value_head'}`; if None, built per `config.critic.init`.
    mesh: defaults to `make_mesh(config.mesh)`.
  """

  def __init__(self, config: ml_collections.ConfigDict, model_config: ModelConfig, actor_params: Any | None,
               critic_params: Any | None = None, mesh: Mesh | None = None):
    self.config = validate_learner_config(config)
    self.model_config = model_config
    self.mesh = mesh if mesh is not None else mesh_lib.make_mesh(dict(config.mesh))
    c = config
    self.actor_loss = routing_replay.actor_loss(
        actor_losses.get(c.actor_loss or actor_losses.DEFAULT_FOR_ALGORITHM[c.algorithm]), c)
    targets.check_loss_fits_algorithm(self.actor_loss, c.algorithm)
    shards = mesh_lib.batch_parallel_size(self.mesh)
    # Rows per micro-batch, per padded length (`sao.train.micro_batching`): static, so each shape compiles its own.
    mbs = micro_batching.parse(c.batching.micro_batch_size, c.batching.get("micro_batch_by_length", ""))
    mbs.check_shards(shards)
    self.batcher = batching.Batcher(c.batching.bucket_lengths, mbs.batch_multiple(shards), c.batching.pad_batch_to,
                                    routing_replay.batcher_routing(c, model_config))
    rng = jax.random.PRNGKey(c.seed)
    rng, critic_rng = jax.random.split(rng)
    self.rng = rng
    self.num_updates = 0
    self.version = 0
    # Multi-process: the trainer sets `agree` to its channel's (`sao.train.coordination`): before each update every
    # process publishes the update's plan (`update_plan`) and a process whose plan differs stops the job, naming both.
    self.agree: Callable[[str, Any], Any] | None = None
    self._last_programs: dict | None = None  # the previous update's `ProgramLog.summary()`, part of the next plan
    self.actor_start = actor_start_lib.ActorStart(c.sao)  # whether an SAO update takes its actor step

    self.actor = roles.Role("actor", abstract_params(model_config), c.actor, self.mesh)
    if actor_params is None:  # abstract learner (see Args)
      self.actor.state = self.actor.abstract_state()
    else:
      state_lib.check_params("actor_params", actor_params, self.actor.abstract_params)
      self.actor.state = state_lib.init_state(actor_params, self.actor.shardings, self.actor.tx)
    self._actor_steps = {
        loss.name: steps.make_actor_step(loss.name, model_config, self.actor.tx, self.actor.trainable,
                                         self.actor.shardings, self.mesh, micro_batch_size=mbs,
                                         temperature=c.temperature, logprob_chunk_size=c.logprob_chunk_size,
                                         hparams=loss.hparams(c))
        for loss in (self.actor_loss, actor_losses.get("sft"))}
    # `batching.length_groups`: the update's steps over length-sorted row groups (None: one [B, T] call).
    self._grouped_actor_step = grouped_steps.make_grouped_actor_step(
        self.actor_loss.name, model_config, self.actor.tx, self.actor.trainable, self.actor.shardings, self.mesh,
        micro_batch_size=mbs, temperature=c.temperature, logprob_chunk_size=c.logprob_chunk_size,
        hparams=self.actor_loss.hparams(c)) if c.batching.length_groups else None
    self._grouped_critic_step = None
    self.actor_logprobs = steps.make_actor_logprobs(model_config, self.actor.param_shardings, self.mesh, mbs,
                                                    c.temperature, c.logprob_chunk_size)
    self.critic: roles.Role | None = None
    if c.algorithm == "sao":
      self.critic = roles.Role("critic", abstract_params(model_config, critic=True), c.critic, self.mesh)
      if actor_params is None:  # abstract learner: no critic params are built or loaded
        self.critic.state = self.critic.abstract_state()
      elif critic_params is None and c.critic.init == "checkpoint":
        critic_params = ckpt_lib.load_params(c.critic.init_path, self.critic.sharded_abstract_params())
      elif critic_params is None:
        critic_params = MeshJit(init_critic_from_policy, None, out_shardings=self.critic.param_shardings)(
            self.actor.state.params, critic_rng)
      if actor_params is not None:
        state_lib.check_params("critic_params", critic_params, self.critic.abstract_params)
        self.critic.state = state_lib.init_state(critic_params, self.critic.shardings, self.critic.tx)
      self._critic_step = steps.make_critic_step(model_config, self.critic.tx, self.critic.trainable,
                                                 self.critic.shardings, self.mesh, micro_batch_size=mbs,
                                                 value_clip=c.critic.value_clip)
      self._critic_values = steps.make_critic_values(model_config, self.critic.param_shardings, self.mesh, mbs)
      if c.batching.length_groups:
        self._grouped_critic_step = grouped_steps.make_grouped_critic_step(
            model_config, self.critic.tx, self.critic.trainable, self.critic.shardings, self.mesh,
            micro_batch_size=mbs, value_clip=c.critic.value_clip)
    self._batch_sharding = mesh_lib.batch_sharding(self.mesh)
    # `x[rows]` of a per-row device array, sharded as a batch: a length group's rows of the whole batch's `Â_i`.
    self._take_rows = MeshJit(lambda x, rows: x[rows], None, name="take_rows", out_shardings=self._batch_sharding)

  # ---------------------------------------------------------------------------------------------- public API
  @property
  def actor_params(self) -> Any:
    """The live, sharded policy params (global arrays, possibly spanning processes). Valid until the next update
    (steps donate their state): export (`sao.train.export.export_policy`) or copy."""
    return self.actor.state.params

  def actor_params_on_host(self) -> Any:
    """The policy params as numpy, the same on every process, gathered one tensor at a time (a collective: every
    process calls it). Holds the whole model on each host: for small models (the toy warm start)."""
    return distributed.fetch(self.actor.state.params)

  @property
  def critic_params(self) -> Any:
    if self.critic is None:
      raise ValueError(f"algorithm: {self.config.algorithm!r} has no critic")
    return self.critic.state.params

  def make_batch(self, trajectories: Sequence[Trajectory]) -> tuple[dict[str, np.ndarray], batching.BatchStats]:
    """Pads trajectories into a host batch whose `B` fits this learner's mesh and micro-batching."""
    return self.batcher(trajectories)

  def critic_values(self, batch: dict) -> jax.Array:
    """Critic values `[B, T]` (aligned with the scored token, see `sao.train.steps`)."""
    return self._critic_values(self.critic_params, self._device(batch, ("input_ids", "attention_mask")))

  def policy_logprobs(self, batch: dict) -> tuple[jax.Array, jax.Array]:
    """Trainer log-probs and entropies `[B, T]` of the current policy."""
    return self.actor_logprobs(self.actor_params, self._device(batch, routing_replay.logprob_keys(batch)))

  def update(self, batch: dict | Sequence[Trajectory]) -> dict[str, float]:
    """One training step on a host batch (`make_batch` output) or a list of trajectories. Returns float metrics."""
    return self.update_traced(batch, rows=())[0]

  def update_traced(self, batch: dict | Sequence[Trajectory], rows: Sequence[int]
                    ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """`update`, also returning the critic's view of the batch `rows` *before* the update (SAO only; empty for
    GSPO/GRPO or no rows): `values` (V⁰, aligned as in `sao.train.steps`), `returns` (the critic targets R) and
    `advantages` (the actor's, after whitening when on), each `[len(rows), T]` float32."""
    if not isinstance(batch, dict):
      batch, _ = self.make_batch(batch)
    batching.check_batch(batch)
    self._check_rows(batch)
    batch_metrics = self._batch_metrics(batch)  # staleness against the version that is about to be trained
    rows = np.asarray(rows, np.int64)
    groups = None
    if self.config.batching.length_groups:
      groups = batching.length_groups(batch["attention_mask"], self.config.batching.length_groups,
                                      self.batcher.batch_multiple, self.batcher.bucket_lengths)
    if self.agree is not None:
      self.agree("update", self.update_plan(batch, groups, rows))
    if self.agree is None:  # one process: nothing to compare the program sequence with
      metrics, per_token = self._update_programs(batch, groups, rows)
    else:
      with mesh_jit.ProgramLog() as programs:
        metrics, per_token = self._update_programs(batch, groups, rows)
      self._last_programs = programs.summary()
    if groups is not None:
      batch_metrics["batch/grouped_padded_tokens"] = float(sum(len(g.rows) * g.length for g in groups))
    # `fetch`: per-token arrays are sharded over the batch (across processes on a pod); metrics are replicated.
    traces = {k: np.asarray(v, np.float32)[rows] for k, v in distributed.fetch(per_token).items()} if rows.size else {}
    metrics = critic_stats.diagnostics({k: float(v) for k, v in distributed.fetch(metrics).items()})
    self._guard(metrics)
    self.actor_start.observe(metrics)
    metrics.update(self.actor_start.metrics())
    self.num_updates += 1
    metrics.update(batch_metrics)
    metrics["learner/num_updates"] = float(self.num_updates)
    metrics["learner/version"] = float(self.version)
    return metrics, traces

  def update_plan(self, batch: dict, groups: Sequence[batching.LengthGroup] | None,
                  rows: np.ndarray) -> dict[str, Any]:
    """`sao.train.update_plan.update_plan` of this learner's next update on the host `batch`."""
    return update_plan_lib.update_plan(self.config, self.num_updates, self.version, batch, groups, rows,
                                       self._last_programs, self.actor_start.plan(self.num_updates))

  def _update_programs(self, batch: dict, groups: Sequence[batching.LengthGroup] | None, rows: np.ndarray
                       ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The update's programs on the host batch (grouped or one-call); returns (metrics, per-token host arrays of
    the traced rows' `[B, T]` batch, or device arrays to fetch)."""
    if groups is not None:
      parts = grouped_update.cut(self, batch, groups)  # once, on the host: the update stays in this layout
      mask = np.asarray(batch["action_mask"], bool)
      if self.config.algorithm == "sao":
        metrics, per_token = grouped_update.sao_update(self, parts, mask, want_values_before=bool(rows.size))
      else:
        metrics, per_token = grouped_update.group_update(self, batch, parts, groups, mask), {}
      return metrics, (grouped_update.uncut(per_token, groups, mask.shape) if rows.size else {})
    if self.config.algorithm == "sao":
      return self._update_sao(self._device(batch, batching.fields(batch)), want_values_before=bool(rows.size))
    return self._update_group(self._device(batch, batching.fields(batch))), {}

  def precompile(self, batch_size: int, max_tokens: int, roles: Sequence[str] | None = None) -> Iterator[str]:
    """Compiles the update's programs for every shape a batch of `batch_size` trajectories of at most `max_tokens`
    tokens can give, one per iteration, without running them (`sao.train.precompile.learner_programs`)."""
    return precompile_lib.learner_programs(self, batch_size, max_tokens, roles)

  def sft_update(self, batch: dict | Sequence[Trajectory]) -> dict[str, float]:
    """One supervised step: masked token NLL `−(1/N) Σ m·logp` on the action tokens (the supervised
    warm start, `sao.train.base_policy`)."""
    if not isinstance(batch, dict):
      batch, _ = self.make_batch(batch)
    self._check_rows(batch)
    if self.agree is not None:
      self.agree("sft_update", {"batch": [int(d) for d in np.shape(batch["input_ids"])],
                                "batch_digest": batching.digest(batch)})
    device_batch = self._device(batch, actor_losses.get("sft").batch_keys)
    self.actor.state, m = self._actor_steps["sft"](self.actor.state, device_batch, self._next_rng())
    metrics = {f"actor/{k}": float(v) for k, v in distributed.fetch(m).items()}
    self._guard(metrics)
    return metrics

  def save_critic(self, path: str) -> None:
    """Saves the critic params (value pretraining → save → `critic.init = 'checkpoint'`). Every process calls it
    (orbax writes each process's shards)."""
    ckpt_lib.save_params(path, self.critic_params)

  # ---------------------------------------------------------------------------------------------- checkpoints
  def save_checkpoint(self, checkpointer: ckpt_lib.Checkpointer, extra: dict | None = None,
                      only_if_due: bool = False) -> bool:
    """Saves this learner as step `num_updates` (with `only_if_due`: when `checkpointer.is_due` it); what a step
    holds: `sao.train.learner_checkpoint`."""
    return learner_checkpoint.save(self, checkpointer, extra, only_if_due)

  def restore_checkpoint(self, checkpointer: ckpt_lib.Checkpointer, step: int | None = None) -> dict | None:
    """Restores the newest readable step (or `step`) into this learner (`sao.train.learner_checkpoint.restore`);
    returns its `extra`, or None if there is no checkpoint."""
    return learner_checkpoint.restore(self, checkpointer, step)

  # ---------------------------------------------------------------------------------------------- the algorithms
  def _update_sao(self, batch: dict, want_values_before: bool = True
                  ) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    """The one-call update on the device batch `[B, T]`. Returns (metrics, per-token `[B, T]` arrays: pre-update
    values (only with `want_values_before`), returns, advantages). With Monte-Carlo critic targets and no value clip
    the pre-update values are needed only for the diagnostics, which the first critic epoch's forward then provides
    (`sao.train.critic_stats`)."""
    c = self.config.sao
    metrics: dict[str, jax.Array] = {}
    fused = not (want_values_before or targets.critic_reads_values_before(self.config))
    if fused:
      values_before = None
      returns, returns_var, critic_diag = targets.monte_carlo_returns(batch, c.gamma)
    else:
      values_before = self._critic_values(self.critic.state.params, batch)
      returns, critic_diag = critic_correction.critic_targets(self, batch, values_before)  # GAE or V-trace
    metrics.update(critic_diag)
    critic_batch = dict(steps.select(batch, ("input_ids", "attention_mask", "action_mask"), "critic"),
                        returns=returns, old_values=returns if fused else values_before)  # unread without a clip
    self._critic_epochs(lambda: self._critic_step(self.critic.state, critic_batch, self._next_rng()), metrics,
                        returns_var if fused else None)
    values = self._critic_values(self.critic.state.params, batch)
    advantages, adv_diag = targets.policy_advantages(batch, values, returns, c.gamma, c.lambda_policy_alpha,
                                              c.whiten_advantages, c.lambda_policy)
    metrics.update(adv_diag)
    actor_steps = self.actor_start.decide(self.num_updates)  # `sao.actor_start`: a step count or the critic's EV
    if actor_steps:
      metrics.update(self._actor_update(dict(batch, advantages=advantages)))
    metrics["actor/warmup"] = np.float32(not actor_steps)
    per_token = {"returns": returns, "advantages": advantages}
    if values_before is not None:
      per_token["values"] = values_before
    return metrics, per_token

  def _critic_epochs(self, step: Callable[[], tuple[steps.TrainState, dict]], metrics: dict,
                     returns_var: jax.Array | None) -> None:
    """The K critic epochs (`step()` runs one on the critic's state), their metrics into `metrics`; with
    `returns_var` (the targets' variance, when the pre-update forward was skipped) epoch 0's forward also gives the
    pre-update diagnostics (`sao.train.critic_stats`; `update_traced` computes them after its fetch)."""
    for epoch in range(self.config.sao.critic_epochs):
      self.critic.state, m = step()
      m, first_values = critic_stats.split(m)
      if returns_var is not None and epoch == 0:
        metrics.update({f"critic/{k}": v for k, v in first_values.items()})
        metrics[critic_stats.RETURNS_VAR] = returns_var
      metrics.update({f"critic/{k}": v for k, v in m.items()})
      metrics[f"critic/loss_epoch{epoch}"] = m["loss"]
      metrics[f"critic/skipped_epoch{epoch}"] = m["skipped"]

  def _update_group(self, batch: dict) -> dict[str, jax.Array]:
    """GSPO / GRPO's one-call update on the device batch `[B, T]`."""
    seq_advantages, metrics = targets.group_advantages(batch, self.config.group.normalize_std)
    metrics.update(self._actor_update(dict(batch, seq_advantages=seq_advantages)))
    return metrics

  def _actor_update(self, batch: dict) -> dict[str, jax.Array]:
    """One step of the configured actor loss on the batch fields it reads."""
    loss = self.actor_loss
    actor_batch = steps.select(batch, loss.batch_keys, f"actor loss {loss.name!r}")
    self.actor.state, m = self._actor_steps[loss.name](self.actor.state, actor_batch, self._next_rng())
    return {f"actor/{k}": v for k, v in m.items()}

  # ---------------------------------------------------------------------------------------------- helpers
  def _next_rng(self) -> jax.Array:
    self.rng, rng = jax.random.split(self.rng)
    return rng

  def _device(self, batch: dict, keys: Sequence[str]) -> dict[str, jax.Array]:
    """The host batch's `keys` as global arrays sharded on B. Every process holds the whole host batch (the
    trainer broadcasts it) and copies only its addressable shards (`distributed.global_batch`:
    `jax.make_array_from_callback`, right whether or not the batch axis spans processes; `device_put` with one)."""
    return distributed.global_batch({k: batch[k] for k in keys}, self._batch_sharding)

  def _check_rows(self, batch: dict) -> None:
    rows = np.shape(batch["input_ids"])[0]
    if rows % self.batcher.batch_multiple:
      raise ValueError(f"batch: input_ids has {rows} rows, not a multiple of {self.batcher.batch_multiple} "
                       "(batch shards × every micro-batch row count); build it with Learner.make_batch")

  def _guard(self, metrics: dict[str, float]) -> None:
    """The NaN guard's per-role counts (`roles.count_nonfinite`); an applied actor update bumps `version`."""
    self.version += roles.count_nonfinite([r for r in (self.critic, self.actor) if r is not None], metrics,
                                          self.config.nan_guard_limit, self.num_updates)

  def _batch_metrics(self, batch: dict) -> dict[str, float]:
    valid = np.asarray(batch["valid"], bool)
    lengths = np.asarray(batch["action_mask"], bool)[valid].sum(axis=1)
    staleness = self.version - np.asarray(batch["policy_version"])[valid]
    return {
        "batch/num_trajectories": float(valid.sum()),
        "batch/reward_mean": float(np.mean(np.asarray(batch["rewards"])[valid])),
        "batch/response_length_mean": float(lengths.mean()),
        "batch/response_length_max": float(lengths.max()),
        "batch/staleness_mean": float(staleness.mean()),
        "batch/staleness_max": float(staleness.max()),
        "batch/padded_rows": float(len(valid)),
        "batch/padded_length": float(np.shape(batch["input_ids"])[1]),
    }

