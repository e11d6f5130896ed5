"""The trainer process: the recipe's phases around one gRPC trajectory service, learner steps and weight publishing.

    base policy ──(supervised warm start on demonstrations if recipe.sft_steps)──▶ <workdir>/base_model   (HF directory)
    value pretraining: critic-only updates on the base policy's rollouts ──▶ <workdir>/value_init (orbax params)
    RL: critic loaded from value_init, `critic_warmup_steps` critic-only updates, then actor updates every step

Every step (`sao.train.phase_steps`) takes the first `batch_size` finished trajectories (SAO) or `batch_size / G`
complete groups (GSPO/GRPO) from the service — it never waits for a particular slow rollout — updates the learner,
and, when the actor changed, exports the policy in HF layout to `<workdir>/policy/v<version>` and tells every engine
to load it (`/update_weights_from_disk`), waiting until they serve it or, with `async_publish` (the full-scale
configs'), in the background while the next step runs (`sao.train.publication`). Validation runs on the held-out
split through the same workers (the dispenser leases it as evaluation work every `eval_every` versions) and is
reported as `validation`.

A trainer job may span P processes (one per TPU host, `sao.train.distributed`): every process runs the learner and
every collective step (warm start, value pretraining, updates, checkpoints, exports); process 0 alone serves gRPC,
owns the dispenser and the trajectory log, writes metrics and critic traces, prints, and publishes weights to the
engines. Every decision that steers the program (the next batch, whether a cached base policy, a checkpoint or the
value warm start exists, the checkpoint's dispenser state) is made on process 0 and `share`d through
`sao.train.coordination`, so the P programs cannot diverge (docs/tpu.md, "Multi-host trainer").

This module never imports `sao.rollout`: tasks, demonstrations and the way to start engines and workers come in as
arguments from the entry point (`experiments/train.py`).
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any, Callable, Sequence

import jax
import ml_collections
from absl import logging

from sao.analysis import critic_traces
from sao.engines import fleet as fleet_lib
from sao.models.config import ModelConfig
from sao.models.tokenizer import Tokenizer
from sao.train import base_policy as base_policy_lib
from sao.train import checkpoint as ckpt_lib
from sao.train import coordination
from sao.train import phase_steps
from sao.train import phases
from sao.train import precompile as precompile_lib
from sao.train import progress
from sao.train import publication as publication_lib
from sao.train import stop_signal
from sao.train import writers as writers_lib
from sao.train.export import export_policy
from sao.train.learner import Learner
from sao.transport import staleness_control
from sao.transport.dispenser import DispenserConfig, TaskDispenser
from sao.transport.server import ServerConfig, TrajectoryServer
from sao.transport.trajectory import Trajectory

@dataclasses.dataclass
class Launcher:
  """How the entry point starts the processes around the trainer (embedded: local subprocesses; else external)."""
  start_engines: Callable[[str], Sequence[str]]  # policy HF directory -> engine URLs serving it
  start_workers: Callable[[str], None]  # the trainer's gRPC address
  stop: Callable[[], None] = lambda: None
  check_alive: Callable[[], None] = lambda: None  # raises if a child process died


async def _publish(urls: Sequence[str], model_path: str, version: int,
                   fleet: fleet_lib.Fleet | None = None) -> dict[str, float]:
  """Loads `model_path` as `version` on every server behind `urls` (routers included; `sao.engines.fleet`);
  returns the fleet's metrics (every server's reported version)."""
  return (await (fleet or fleet_lib.Fleet(urls)).publish(model_path, version)).metrics()


class Trainer:
  """Runs the recipe in `config` (see `experiments/configs/common.py`) in `workdir`.

  `channel`: this process's `sao.train.coordination` channel in a P-process trainer job (default: the one-process
  `LocalChannel`). Every process of the job constructs a Trainer with the same arguments and calls `run`; only
  process 0's `launcher` starts anything."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str, tokenizer: Tokenizer,
               train_tasks: Sequence[dict], validation_tasks: Sequence[dict],
               channel: coordination.LocalChannel | coordination.KeyValueChannel | None = None,
               stop: stop_signal.StopSignal | None = None):
    self.config = config
    self.workdir = os.path.abspath(workdir)
    self.tokenizer = tokenizer
    self.train_tasks = list(train_tasks)
    self.validation_tasks = list(validation_tasks)
    self.channel = channel or coordination.LocalChannel()
    self.is_coordinator = self.channel.is_coordinator
    self.stop = stop or stop_signal.StopSignal()  # SIGTERM: stop at the next step boundary (`_stop_point`)
    os.makedirs(self.workdir, exist_ok=True)
    self.writer = writers_lib.create_default_writer(self.workdir) if self.is_coordinator else progress.NoWriter()
    self.trace_writer = critic_traces.TraceWriter(self.workdir) if self.is_coordinator else None
    self.history: list[dict[str, float]] = []
    self.validations: list[tuple[int, float]] = []  # (policy version, success rate)
    self._precompilers: list[precompile_lib.Precompiler] = []
    self._precompiled_ahead = False
    self.publication: publication_lib.Publication | None = None  # process 0's, once the engines exist
    self.staleness: staleness_control.StalenessController | None = None  # process 0's `server.adaptive_staleness`

  def _decide(self, tag: str, decide: Callable[[], Any]) -> Any:
    """`decide()` evaluated on process 0 and shared: every process gets process 0's answer."""
    if self.is_coordinator:
      return self.channel.share(tag, decide()).data
    return self.channel.share(tag).data

  def _learner(self, learner_config: ml_collections.ConfigDict, model_config: ModelConfig, params: Any) -> Learner:
    """A learner whose updates the processes agree on before running them (`Learner.agree`)."""
    learner = Learner(learner_config, model_config, params)
    if self.channel.num_processes > 1:
      learner.agree = self.channel.agree
    return learner

  def _print(self, line: str) -> None:
    if self.is_coordinator:
      print(line, flush=True)

  # ------------------------------------------------------------------------------------------------ the base policy
  def base_policy(self, demonstrations: Callable[[], Sequence[Trajectory]] | None) -> tuple[ModelConfig, Any, str]:
    """The starting policy as (model config, params, HF directory): the configured checkpoint or a freshly
    initialised toy model, warm-started on demonstrations if `recipe.sft_steps` (cached in `<workdir>/base_model`;
    `sao.train.base_policy`)."""
    return base_policy_lib.base_policy(self, demonstrations)

  # ------------------------------------------------------------------------------------------------ serving
  def _server(self, model_config: ModelConfig, engine_urls: Sequence[str]) -> TrajectoryServer:
    c = self.config
    group = c.rollout.group_size
    self.staleness = staleness_control.from_run_config(c.server.get("adaptive_staleness"), c.server.max_outstanding,
                                                       c.rollout.batch_size, group)
    dispenser = TaskDispenser(self.train_tasks, DispenserConfig(
        mode="sao" if group == 1 else "group", group_size=group, seed=c.seed, lease_ttl_s=c.rollout.lease_ttl_s,
        id_key="task_id", env_name=c.env.name, train_temperature=c.learner.temperature,
        eval_temperature=c.rollout.eval_temperature, eval_every=c.rollout.eval_every), self.validation_tasks)
    return TrajectoryServer(ServerConfig(
        log_dir=os.path.join(self.workdir, "trajectories"), vocab_size=model_config.vocab_size,
        host=c.server.host, port=c.server.port, token=os.environ.get(c.server.token_env) or None,
        buffer_capacity=c.server.buffer_capacity, max_staleness=c.server.max_staleness,
        max_outstanding=c.server.max_outstanding, engine_urls=tuple(engine_urls),
        max_tokens=c.learner.batching.bucket_lengths[-1], max_abs_reward=c.server.max_abs_reward,
        min_logprob=c.server.min_logprob), dispenser)

  # ------------------------------------------------------------------------------------------------ the run
  def run(self, launcher: Launcher, demonstrations: Callable[[], Sequence[Trajectory]] | None = None
          ) -> dict[str, float]:
    """Runs (or resumes) the whole recipe; returns the last step's progress row (process 0; {} elsewhere).

    In a P-process job an error that a lost process caused (a failed collective) is raised as the
    `coordination.ProcessLost` naming it; any other error is reported to the other processes before it is raised."""
    try:
      return self._run(launcher, demonstrations)
    except stop_signal.StopRequested:
      raise  # every process stops at the same step: nobody failed
    except Exception as e:
      # A collective fails (gloo) or hangs (the watchdog) when a peer is lost: wait for the verdict that names it.
      error = self.channel.explain(e) if isinstance(e, jax.errors.JaxRuntimeError) else e
      if not isinstance(error, coordination.ProcessLost):
        self.channel.report_failure(f"{type(e).__name__}: {e}")
      if error is e:
        raise
      raise error from e

  def _run(self, launcher: Launcher, demonstrations: Callable[[], Sequence[Trajectory]] | None
           ) -> dict[str, float]:
    c = self.config
    model_config, params, base_dir = self.base_policy(demonstrations)
    self.launcher = launcher
    server = None
    try:
      checkpointer = ckpt_lib.Checkpointer(os.path.join(self.workdir, "checkpoints"), c.checkpoint_every,
                                           c.learner.checkpoint.max_to_keep, c.learner.checkpoint.async_save)
      value_init = os.path.join(self.workdir, "value_init")
      start = self._decide("start", lambda: {"resume": bool(checkpointer.all_steps()),
                                             "value_init": os.path.isdir(value_init)})
      resume, has_value_init = start["resume"], start["value_init"]
      if self.is_coordinator:
        self.engine_urls = tuple(c.engine_urls) or tuple(launcher.start_engines(base_dir))
        self.fleet = fleet_lib.Fleet(self.engine_urls)  # remembers servers it took out of a router's rotation
        server = self._server(model_config, self.engine_urls)
        self.publication = publication_lib.Publication(
            lambda path, version: asyncio.run(_publish(self.engine_urls, path, version, self.fleet)), server,
            c.keep_policy_exports, background=c.async_publish)
        if c.engine_urls and not resume and base_dir != c.model.get("hf_path", ""):
          # A fleet started elsewhere (launch/tpu_pod.py, launch/sglang_fleet.py) serves `model.hf_path`; the
          # rollouts must sample the policy the learner starts from (the warm-started `<workdir>/base_model`).
          self.publication.start(base_dir, 0)
          self.publication.wait()
      step, learner = 0, None
      if resume:
        learner = self._rl_learner(model_config, params, value_init, has_value_init)
        extra = learner.restore_checkpoint(checkpointer)
        step = int(extra["step"])
        self.validations = [(int(version), float(rate)) for version, rate in extra.get("validations", [])]
        if server is not None:
          server.restore(extra.get("dispenser"))
        logging.info("resumed at step %d (learner update %d, policy version %d)", step, learner.num_updates,
                     learner.version)
      if server is not None:
        port = server.start()
        if self.channel.num_processes > 1:
          print(f"[trainer] process 0 of {self.channel.num_processes}: trajectory service on {c.server.host}:{port}",
                flush=True)
        launcher.start_workers(f"{c.server.host}:{port}")
      if resume:
        self._publish(model_config, learner)
      else:
        if server is not None:
          server.dispenser.schedule_eval(0, repeats=c.rollout.base_eval_repeats)
        if c.learner.algorithm == "sao" and c.recipe.value_pretrain_steps > 0 and not has_value_init:
          step = self._value_pretraining(model_config, params, server, value_init)
          has_value_init = True
        learner = self._rl_learner(model_config, params, value_init, has_value_init)
      # Steps count trajectories batches across phases: value pretraining, then `total_steps` RL steps.
      summary = self._train(learner, model_config, server, checkpointer, step, self._end_step())
      if self.publication is not None:
        self.publication.wait()  # the last version's publish: its failure is the run's
      # The last periodic save may already hold this learner step (orbax refuses to overwrite a step).
      checkpointer.wait()
      if self._decide("final_checkpoint", lambda: learner.num_updates not in checkpointer.all_steps()):
        learner.save_checkpoint(checkpointer, extra=self._checkpoint_extra(self._end_step(), "rl", server))
      checkpointer.wait()
      return summary
    finally:
      if self.publication is not None:
        self.publication.close()
      for precompiler in self._precompilers:
        precompiler.stop()
      launcher.stop()
      if server is not None:
        server.stop()
      self.writer.close()

  def _checkpoint_extra(self, step: int, phase: str, server) -> dict:
    """A checkpoint's `extra` (the step to resume at, the phase, process 0's dispenser state and the validations so
    far, so a resumed run still reports its base policy's), the same on every process."""
    return self._decide("checkpoint", lambda: {"step": step, "phase": phase,
                                               "dispenser": server.dispenser.state_dict(),
                                               "validations": [list(v) for v in self.validations]})

  def _end_step(self) -> int:
    c = self.config
    return c.recipe.value_pretrain_steps * (c.learner.algorithm == "sao") + c.total_steps

  def _rl_learner(self, model_config, params, value_init: str, has_value_init: bool) -> Learner:
    learner = self._learner(phases.rl_config(self.config, value_init, has_value_init), model_config, params)
    self._precompile(learner)
    return learner

  def _precompile(self, learner: Learner, roles: Sequence[str] | None = None) -> None:
    """With `learner.batching.precompile`, compiles `roles`' programs for every batch shape in a thread while the run
    goes on (`sao.train.precompile`): no update stalls on a shape it meets first. Not again when the supervised warm
    start compiled them ahead (`_precompile_ahead`): the persistent compilation cache holds them."""
    c = self.config
    if c.learner.batching.precompile and not self._precompiled_ahead:
      self._precompilers.append(precompile_lib.Precompiler(
          learner.precompile(c.rollout.batch_size, c.rollout.max_total_tokens, roles), f"{roles or 'update'}"))

  def _precompile_ahead(self, model_config: ModelConfig) -> None:
    """With `learner.batching.precompile` and a persistent compilation cache, compiles the later phases'
    update programs (value pretraining's critic, the RL learner's) during the supervised warm start, in a thread, on
    abstract learners of the same configs: the same programs, so the real learners' first calls find the
    executables in the cache (they still trace and lower). Pays only where the warm start leaves cores idle: on the
    toy's 2 cores it slowed the warm start more than it saved (docs/performance_learner.md, "The main job's update")."""
    if self.config.learner.batching.precompile and jax.config.jax_compilation_cache_dir:
      self._precompilers.append(precompile_lib.Precompiler(phases.ahead_programs(self.config, model_config), "ahead"))
      self._precompiled_ahead = True

  def _value_pretraining(self, model_config, params, server, value_init: str) -> int:
    """Critic-only updates (actor frozen) on the base policy's rollouts; saves the critic for the RL phase."""
    steps = self.config.recipe.value_pretrain_steps
    learner = self._learner(phases.value_pretrain_config(self.config), model_config, params)
    self._precompile(learner, ("critic",))  # the actor does not train here
    self._print(f"[value pretraining] {steps} critic-only steps on base-policy rollouts")
    self._train(learner, model_config, server, None, 0, steps, phase="value_pretrain")
    with self.channel.busy("value pretraining: saving the critic"):
      learner.save_critic(value_init)
    self._print(f"[value pretraining] critic saved to {value_init}; the RL phase loads it")
    return steps

  def _publish(self, model_config, learner, wait: bool = True) -> list[dict[str, float]]:
    """Exports the actor as `<workdir>/policy/v<version>` and, on process 0, publishes it to the engines
    (`sao.train.publication`): `wait` until they serve it, else in the background while the caller trains on.
    Returns the reports of the publishes that finished here, oldest first (the previous version's, then with
    `wait` this one's)."""
    version = learner.version
    path = os.path.join(self.workdir, "policy", f"v{version}")
    with self.channel.busy(f"exporting policy v{version}"):
      export_policy(model_config, learner.actor_params, self.tokenizer, path)  # every process takes part
    if not self.is_coordinator:
      return []
    reports = [self.publication.start(path, version)]
    if wait:
      reports.append(self.publication.wait())
    return [r for r in reports if r]

  def _take(self, server, n: int) -> list[Trajectory] | None:
    """Process 0: the next `n` finished trajectories; None once a stop is requested while it waits."""
    while True:
      batch = server.take_batch(n, timeout_s=5.0)
      if batch:
        return batch
      if self.stop.requested:
        return None
      self.launcher.check_alive()
      self.channel.check()  # a lost learner process stops the job here, not at the next collective

  def _train(self, learner: Learner, model_config, server, checkpointer, start_step: int,
             end_step: int, phase: str = "rl") -> dict[str, float]:
    """Steps `start_step` … `end_step − 1` of `phase` (`sao.train.phase_steps`: batch, update, publish, report,
    checkpoint, stop); returns the last step's progress row (process 0; {} elsewhere)."""
    return phase_steps.PhaseSteps(self, learner, model_config, server, checkpointer, phase).run(start_step, end_step)
