"""Ahead-of-time compilation of one learner update for any device set (a TPU topology from libtpu, or CPU devices):
per program and bucket length, HBM per chip, FLOPs and XLA's cost-model time.

The programs are the trainer's own. `compile_update` builds an abstract `Learner` (`actor_params=None`: states are
`ShapeDtypeStruct`s with the learner's shardings, nothing is allocated or loaded) on a mesh over the given devices,
then runs the learner's update code (`Learner._update_sao` / `_update_group`) on an abstract batch with every
jitted program of the learner — its attributes (`_critic_values`, `_critic_step`, `_actor_steps[...]`, …) and the
jitted functions of `sao.train.targets` (`critic_targets`, …) and `sao.train.critic_correction` (`vtrace_targets`)
— replaced by a recorder. The recorder keeps each
call's abstract arguments and answers with the program's abstract outputs, so the update runs to its end, in the
trainer's order, with the trainer's micro-batching; then each recorded program is lowered and compiled once per
bucket length. `actor_logprobs` (the learner's forward log-prob program, which an update of DIS / GSPO with
`ratio_base="trainer"` does not call) is compiled as well, with calls = 0.

The abstract batch is `rollout.batch_size` trajectories at the bucket's length, `B` padded by the learner's batcher
exactly as in training (`sao.train.precompile.abstract_batch`).
"""
from __future__ import annotations

import collections
import dataclasses
import gzip
import os
import time
from typing import Any, Callable, Sequence

import jax
import ml_collections
from absl import logging

from sao import run_config
from sao.aot import compile_stats, instruction_time
from sao.aot.tpu_topology import Chip
from sao.models.config import ModelConfig
from sao.train import critic_correction as critic_correction_lib
from sao.train import precompile
from sao.train import targets as targets_lib
from sao.train import mesh as mesh_lib
from sao.train.learner import Learner

FORWARD_PROGRAMS = ("actor_logprobs",)  # compiled though an update does not call them (see the module docstring)


@dataclasses.dataclass
class ProgramRow:
  """One (program, bucket) of the report. Bytes are per chip; FLOPs are for the whole program over all chips."""
  program: str
  bucket: int
  batch: int  # B: padded rows of the batch
  calls: int  # how many times one update runs it
  role: str  # actor | critic | "" (elementwise programs)
  train: bool
  fits: bool
  argument_bytes: int
  output_bytes: int  # outputs that do not reuse a donated argument
  temp_bytes: int
  hbm_bytes_per_chip: int
  hbm_capacity_bytes: int
  flops: float  # matmul FLOPs of the program, loops multiplied out (compile_stats.jaxpr_flops)
  xla_flops: float  # XLA's cost_analysis() FLOPs over all chips (each loop body once)
  analytic_flops: float  # model FLOPs (compile_stats.analytic_flops, causal attention); 0 for elementwise programs
  # XLA's cost-model time (`optimal_seconds`, or the roofline of its FLOP and byte counts when that is not positive),
  # scaled by flops / xla_flops for the loop iterations XLA leaves out; None if it does not fit.
  estimated_seconds: float | None
  estimated_mfu: float | None  # analytic_flops / (estimated_seconds · chips · peak bf16 FLOP/s)
  compile_seconds: float
  error: str = ""  # why it does not fit: XLA's message, or the compiled program's total over the capacity
  largest_buffers: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  estimate_source: str = ""  # xla_optimal_seconds | roofline_of_xla_counts (when XLA's own time is not positive)
  # The per-instruction serial sum of the compiled HLO on the chip (`instruction_time`), seconds per call, the MFU it
  # implies, and the share of the MoE's grouped-matmul rows it priced (1: every row); None where the row has no
  # compiled program, or a report row compiled before it was recorded (`experiments/annotate_report.py` adds it from
  # the saved HLO). `instruction_error`: why the HLO could not be priced.
  instruction_seconds: float | None = None
  instruction_mfu: float | None = None
  grouped_row_share: float = 1.0
  instruction_error: str = ""
  # The attention count of `analytic_flops` and the MFUs (`compile_stats.MODEL_FLOPS_CONVENTION`); rows compiled
  # before 2026-12-06 lack the field and hold PaLM's "full_attention" (`experiments/bench/mfu_conventions.py
  # --rewrite` recounts them).
  model_flops_convention: str = compile_stats.MODEL_FLOPS_CONVENTION


class _Recorder:
  """Stands in for jitted programs while the update runs on abstract arrays (see the module docstring)."""

  def __init__(self):
    self.calls: dict[str, list] = collections.OrderedDict()  # name -> [jitted, abstract args, count]

  def wrap(self, name: str, jitted: Any) -> Callable:
    def call(*args):
      args = tuple(_abstract(a) for a in args)
      if name in self.calls:
        self.calls[name][2] += 1
      else:
        self.calls[name] = [jitted, args, 1]
      # The program's own eval_shape: a `steps.MeshJit` traces under the learner's mesh, as when it runs.
      return jitted.eval_shape(*args)
    return call


def _abstract(tree: Any) -> Any:
  """Concrete jax arrays (the learner's rng keys, on the host's CPU) → unsharded ShapeDtypeStructs."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if isinstance(x, jax.Array) else x, tree)


def _is_jitted(value: Any) -> bool:
  return callable(value) and hasattr(value, "lower") and hasattr(value, "trace")


def abstract_learner(config: ml_collections.ConfigDict, model_config: ModelConfig,
                     devices: Sequence[jax.Device]) -> Learner:
  """The learner of `config.learner` on a mesh over `devices`, with abstract states. With `batching.length_groups`
  (the toy configs) the learner runs smaller per-group programs; the report compiles the one-call programs of the
  padded `[B, T]` batch instead, their upper bound, and says so."""
  mesh = mesh_lib.make_mesh(dict(config.learner.mesh), devices)
  learner_config = config.learner
  if learner_config.batching.length_groups:
    logging.warning("aot: batching.length_groups = %d ignored: compiling the one-call programs of the padded batch "
                    "(the per-group programs are no larger)", learner_config.batching.length_groups)
    learner_config = run_config.set_all(ml_collections.ConfigDict(learner_config.to_dict()),
                                        {"batching.length_groups": 0})
  return Learner(learner_config, model_config, None, mesh=mesh)


def record_update(learner: Learner, batch: dict[str, jax.ShapeDtypeStruct]) -> dict[str, list]:
  """Runs one update of `learner` on the abstract `batch` with every jitted program recorded, not run.

  Returns `{program name: [jitted, abstract args, calls]}` in call order, plus `FORWARD_PROGRAMS` (calls 0).
  """
  if learner.config.batching.length_groups:
    raise ValueError(f"aot: batching.length_groups = {learner.config.batching.length_groups}: the compile report "
                     "covers the one-call programs of a padded [B, T] batch; set batching.length_groups=0")
  recorder = _Recorder()
  saved_attrs, saved_globals = {}, {}
  for attr, value in list(vars(learner).items()):
    name = attr.strip("_")
    if _is_jitted(value):
      saved_attrs[attr] = value
      setattr(learner, attr, recorder.wrap(name, value))
    elif isinstance(value, dict) and value and all(_is_jitted(v) for v in value.values()):
      saved_attrs[attr] = value
      setattr(learner, attr, {k: recorder.wrap(f"{name.rstrip('s')}_{k}", v) for k, v in value.items()})
  for module in (targets_lib, critic_correction_lib):
    for attr, value in list(vars(module).items()):
      if _is_jitted(value):
        saved_globals[(module, attr)] = value
        setattr(module, attr, recorder.wrap(attr.strip("_"), value))
  saved_state = {role.name: role.state for role in (learner.actor, learner.critic) if role is not None}
  saved_updates, saved_actor_start = learner.num_updates, learner.actor_start
  try:
    # Past the critic warmup and with the actor's start decided (`sao.actor_start`: a step count or the critic's EV,
    # which an abstract update has none of), so that the SAO update also runs its actor step.
    learner.num_updates = learner.config.sao.critic_warmup_steps
    learner.actor_start = _ActorStarted()
    if learner.config.algorithm == "sao":
      # As the trainer's `update` runs it: V⁰ only where the critic's targets or loss read it.
      learner._update_sao(batch, want_values_before=False)  # pylint: disable=protected-access
    else:
      learner._update_group(batch)  # pylint: disable=protected-access
    for name in FORWARD_PROGRAMS:
      getattr(learner, name)(saved_state["actor"].params, {k: batch[k] for k in ("input_ids", "attention_mask")})
      recorder.calls[name][2] = 0
  finally:
    for attr, value in saved_attrs.items():
      setattr(learner, attr, value)
    for (module, attr), value in saved_globals.items():
      setattr(module, attr, value)
    for role in (learner.actor, learner.critic):
      if role is not None:
        role.state = saved_state[role.name]
    learner.num_updates, learner.actor_start = saved_updates, saved_actor_start
  return recorder.calls


class _ActorStarted:
  """`sao.train.actor_start.ActorStart` with the actor started: what `record_update` needs of it."""

  def decide(self, num_updates: int) -> bool:  # pylint: disable=unused-argument
    return True


def _role_of(learner: Learner, first_arg: Any) -> tuple[str, bool]:
  """(role, is a train step) of a program from its first argument: a role's TrainState or its params."""
  for role in (learner.actor, learner.critic):
    if role is None:
      continue
    if jax.tree.structure(first_arg) == jax.tree.structure(role.state):
      return role.name, True
    if jax.tree.structure(first_arg) == jax.tree.structure(role.state.params):
      return role.name, False
  return "", False


def compile_program(name: str, jitted: Any, args: tuple, calls: int, learner: Learner, model_config: ModelConfig,
                    chip: Chip, bucket: int, n_active: dict[str, float], hlo_dir: str = "") -> ProgramRow:
  """Lowers and compiles one recorded program; a program XLA finds too big for the chip gives `fits=False`.
  With `hlo_dir`, the compiled (optimised, partitioned) HLO goes to `<hlo_dir>/<name>_T<bucket>.hlo.txt.gz`, so what
  XLA's estimate spends its time on can be read later without compiling again (`hlo_path`)."""
  role, train = _role_of(learner, args[0]) if args else ("", False)
  chips = learner.mesh.devices.size
  batches = [a for a in args if isinstance(a, dict) and "action_mask" in a or isinstance(a, dict) and "input_ids" in a]
  batch = int(next(iter(batches[0].values())).shape[0]) if batches else 0  # B of the program's batch argument
  start = time.perf_counter()
  traced = jitted.trace(*args)
  flops = compile_stats.jaxpr_flops(traced.jaxpr, platform=learner.mesh.devices.flat[0].platform)
  lowered = traced.lower()
  analytic = compile_stats.analytic_flops(model_config, n_active[role], batch, bucket, train) if role else 0.0
  compiled, error, report = compile_stats.compile_with_report(lowered, prefix="sao_aot_")
  seconds = time.perf_counter() - start
  largest = [dataclasses.asdict(b) for b in report.largest] if report else []
  if compiled is not None:
    text = compiled.as_text()
    if hlo_dir:
      write_hlo(text, hlo_path(hlo_dir, name, bucket))
    memory = compiled.memory_analysis()
    outputs = memory.output_size_in_bytes - memory.alias_size_in_bytes
    arguments, temps = memory.argument_size_in_bytes, memory.temp_size_in_bytes
    total = arguments + outputs + temps + memory.generated_code_size_in_bytes
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    xla_flops = float(cost.get("flops", 0.0)) * chips
    scale = max(1.0, flops / xla_flops) if xla_flops > 0 else 1.0
    est, source = float(cost.get("optimal_seconds", -1.0)), "xla_optimal_seconds"
    if est <= 0:  # libtpu 0.0.42.1 returns a negative time for the train steps: use the roofline of XLA's counts
      est = max(float(cost.get("flops", 0.0)) / chip.peak_bf16_flops,
                float(cost.get("bytes accessed", 0.0)) / chip.hbm_bytes_per_second)
      source = "roofline_of_xla_counts"
    est = est * scale or None
    mfu = analytic / (est * chips * chip.peak_bf16_flops) if est and analytic else None
    # XLA may compile a program whose buffers exceed the chip (seen with libtpu 0.0.42.1 on scanned train steps): the
    # memory analysis, not the absence of an error, decides.
    fits = total <= chip.hbm_bytes
    error = "" if fits else (f"compiled, but needs {total / 2**30:.2f} GiB per chip, more than the chip's "
                             f"{chip.hbm_bytes / 2**30:.2f} GiB")
    row = ProgramRow(name, bucket, batch, calls, role, train, fits, arguments, outputs, temps, total,
                     chip.hbm_bytes, flops, xla_flops, analytic, est, mfu, seconds, error, largest, source)
    share, _ = instruction_time.grouped_row_share(int(learner.mesh.shape.get("expert", 1)),
                                                  float(model_config.moe_capacity_factor))
    price_instructions(row, text, chip, chips, share)
    return row
  if report is not None:
    arguments, outputs, temps = report.argument_bytes, report.output_bytes, report.temp_bytes
    total = arguments + outputs + temps
  else:
    required = compile_stats.oom_required_bytes(error)
    arguments = outputs = temps = 0
    total = required[0] if required else 0
  return ProgramRow(name, bucket, batch, calls, role, train, False, arguments, outputs, temps, total,
                    chip.hbm_bytes, flops, 0.0, analytic, None, None, seconds, error, largest)


def hlo_path(hlo_dir: str, program: str, bucket: int) -> str:
  return os.path.join(hlo_dir, f"{program}_T{bucket}.hlo.txt.gz")


def write_hlo(text: str, path: str) -> None:
  """A compiled module's HLO text, gzipped (a full-depth train step is tens of MB of text), written atomically."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with gzip.open(path + ".tmp", "wt", compresslevel=6) as f:
    f.write(text)
  os.replace(path + ".tmp", path)


def price_instructions(row: ProgramRow, text: str, chip: Chip, chips: int, row_share: float) -> None:
  """Sets `row`'s per-instruction time (`instruction_time.serial_seconds` of the HLO `text`) and its MFU; an HLO the
  pricer cannot read leaves them None and says why in `instruction_error` (the compile itself stays recorded)."""
  row.grouped_row_share = row_share
  try:
    seconds = instruction_time.serial_seconds(text, chip, row_share)
  except Exception as e:  # pylint: disable=broad-except  # a pricing gap must not discard a minutes-long compile
    row.instruction_seconds = row.instruction_mfu = None
    row.instruction_error = f"{type(e).__name__}: {e}"[:1000]
    logging.warning("%s at T=%d: the HLO could not be priced: %s", row.program, row.bucket, row.instruction_error)
    return
  row.instruction_seconds, row.instruction_error = seconds, ""
  row.instruction_mfu = (row.analytic_flops / (seconds * chips * chip.peak_bf16_flops)
                         if seconds > 0 and row.analytic_flops else None)


def compile_update(config: ml_collections.ConfigDict, model_config: ModelConfig, devices: Sequence[jax.Device],
                   chip: Chip, buckets: Sequence[int] | None = None, programs: Sequence[str] = (),
                   progress: Callable[[ProgramRow], None] = lambda row: None) -> list[ProgramRow]:
  """Every program of one update of `config` (an experiment config: `learner`, `rollout.batch_size`) at every
  bucket length (`config.learner.batching.bucket_lengths` unless `buckets`), compiled for `devices`.
  `programs` (names) restricts the report; `progress` sees each row as it is made."""
  learner = abstract_learner(config, model_config, devices)
  n_active = {role.name: compile_stats.active_params(model_config, role.abstract_params)
              for role in (learner.actor, learner.critic) if role is not None}
  rows = []
  for bucket in buckets or tuple(config.learner.batching.bucket_lengths):
    batch = precompile.abstract_batch(learner, int(config.rollout.batch_size), int(bucket))
    recorded = record_update(learner, batch)
    unknown = set(programs) - set(recorded)
    if unknown:
      raise ValueError(f"programs: {sorted(unknown)} are not programs of this update ({list(recorded)})")
    for name, (jitted, args, calls) in recorded.items():
      if programs and name not in programs:
        continue
      row = compile_program(name, jitted, args, calls, learner, model_config, chip, int(bucket), n_active)
      progress(row)
      rows.append(row)
  return rows
