"""Ahead-of-time compilation of the learner's update (`sao.aot.driver`, `experiments/compile_tpu.py`).

The TPU tests compile for a v5p-4 topology through libtpu (the `test` extra installs it; without it they skip).
The CPU test runs the same path on this machine's CPU devices, so a change to the learner that breaks the recorder
fails here even without libtpu.

FLOP bounds: the model's MoE layers run every expert on every token (dense dispatch), so the program's matmul FLOPs
lie between the analytic count (active experts only) and `num_experts / top_k` (= 4 for the tiny models) times it;
frozen critic attention skips its weight gradients, which can only lower the count, by less than half.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from experiments.compile_tpu import model_config_of, truncated
from experiments.configs import gspo_openswe, sao_openswe
from sao.aot import compile_stats, driver
from sao.aot.tpu_topology import GIB, Chip, parse_topology
from sao.models.config import ModelConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]
# λ_critic = 1 and no value clip (the recipes): R without V⁰, one critic forward (after the critic's epochs).
SAO_PROGRAMS = {"critic_values", "monte_carlo_returns", "critic_step", "policy_advantages", "actor_step_dis",
                "actor_logprobs"}
# A value clip (or λ_critic < 1) reads V⁰: the pre-update forward and `critic_targets` come back.
SAO_PROGRAMS_WITH_V0 = SAO_PROGRAMS - {"monte_carlo_returns"} | {"critic_targets"}
GSPO_PROGRAMS = {"group_advantages", "actor_step_gspo", "actor_logprobs"}
ADVANTAGE_PROGRAMS = {"critic_targets", "monte_carlo_returns", "policy_advantages", "group_advantages"}
needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu is not installed (pip install -e '.[test]' installs it)")


def _config(module, model_type: str, bucket: int, batch_size: int = 8):
  config = module.get_config(f"toy,rollout.batch_size={batch_size}")
  config.unlock()
  config.model.toy.model_type = model_type
  config.learner.batching.bucket_lengths = (bucket,)
  config.lock()
  return config


def _check_rows(rows, programs, model_config: ModelConfig):
  assert {r.program for r in rows} == programs
  ratio_bound = model_config.num_experts / model_config.num_experts_per_tok
  for r in rows:
    assert r.fits, r
    assert r.hbm_bytes_per_chip > 0 and r.argument_bytes > 0
    if r.role:  # a model program: its FLOPs against the analytic count
      assert r.batch > 0 and r.analytic_flops > 0
      assert 0.5 * r.analytic_flops <= r.flops <= ratio_bound * r.analytic_flops, (r.program, r.flops,
                                                                                   r.analytic_flops)
      assert r.estimated_seconds > 0 and 0 < r.estimated_mfu < 1
      assert r.instruction_seconds > 0 and 0 < r.instruction_mfu < 1
  calls = {r.program: r.calls for r in rows}
  if "critic_step" in calls:
    forwards = 2 if "critic_targets" in calls else 1  # V⁰ before the critic's epochs, V after them
    assert calls["critic_step"] == 2 and calls["critic_values"] == forwards and calls["actor_step_dis"] == 1
  assert calls["actor_logprobs"] == 0


def test_jaxpr_flops_multiplies_loops_out():
  """XLA counts a loop body once; the jaxpr count multiplies by the scan length (matmul `[4, 8] @ [8, 16]`)."""
  w = jax.ShapeDtypeStruct((8, 16), "float32")
  xs = jax.ShapeDtypeStruct((5, 4, 8), "float32")
  scan = lambda w, xs: jax.lax.scan(lambda c, x: (c + (x @ w).sum(), None), 0.0, xs)[0]
  assert compile_stats.program_flops(scan, w, xs) == 5 * 2 * 4 * 8 * 16
  grad = jax.grad(lambda w, x: (x @ w).sum())  # the forward matmul, and one more for dL/dw (none for dL/dx)
  assert compile_stats.program_flops(grad, w, jax.ShapeDtypeStruct((4, 8), "float32")) == 2 * (2 * 4 * 8 * 16)


def test_jaxpr_flops_counts_a_shard_map_body_on_every_device_of_its_manual_axes():
  """A shard_map body sees one shard's shapes; the program's count is over all chips, as for the unsharded matmul."""
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=jax.devices()[:8])
  x, w = jax.ShapeDtypeStruct((8, 4), "float32"), jax.ShapeDtypeStruct((4, 16), "float32")
  dense = 2 * 8 * 4 * 16
  both = lambda x, w: jax.shard_map(lambda x, w: x @ w, mesh=mesh, in_specs=(P("a"), P(None, "b")),
                                    out_specs=P("a", "b"))(x, w)
  assert compile_stats.program_flops(both, x, w) == dense
  # Only `a` manual (b stays automatic, its shapes global), and a body replicated over `a` runs on each of its 2.
  rows = lambda x, w: jax.shard_map(lambda x, w: x @ w, mesh=mesh, in_specs=(P("a"), P()), out_specs=P("a"),
                                    axis_names={"a"})(x, w)
  assert compile_stats.program_flops(rows, x, w) == dense
  replicated = lambda x, w: jax.shard_map(lambda x, w: x @ w, mesh=mesh, in_specs=(P(), P()), out_specs=P(),
                                          axis_names={"a"}, check_vma=False)(x, w)
  assert compile_stats.program_flops(replicated, x, w) == 2 * dense


@pytest.mark.parametrize("impl", ["ragged_dot", "xla", "megablox_interpret", "auto"])
def test_jaxpr_flops_counts_grouped_matmuls_once_per_row(impl):
  """A grouped matmul `[M, K] × [G, K, N]` does `2·M·K·N` FLOPs (each row meets one group), forward, and the same
  again for each of d_lhs and d_rhs; whatever the kernel: `ragged_dot_general` (its d_rhs has the ragged dimension
  contracting), megablox's Pallas kernels (by their cost estimate; the grid is data-dependent), and for "auto" the
  branch `lax.platform_dependent` takes on the named platform (the CPU branch pads rows into tiles)."""
  from sao.models import grouped_matmul as gm  # pylint: disable=g-import-not-at-top
  m, k, n, g = 256, 128, 64, 4
  group_sizes = jnp.array([100, 0, 60, 96], jnp.int32)
  loss = lambda a, b: gm.grouped_matmul(a, b, group_sizes, impl=impl).sum()
  lhs, rhs = jax.ShapeDtypeStruct((m, k), "float32"), jax.ShapeDtypeStruct((g, k, n), "float32")
  jaxpr = jax.make_jaxpr(loss)(lhs, rhs)
  grads = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(lhs, rhs)
  platform = "tpu" if impl == "auto" else None
  assert compile_stats.jaxpr_flops(jaxpr, platform) == 2 * m * k * n
  d_rhs_tiles = impl in ("xla", "auto")  # "xla"'s weight gradient is the tiled tgmm: its padded tiles count
  expected = 3 * 2 * m * k * n
  if d_rhs_tiles:
    assert expected <= compile_stats.jaxpr_flops(grads, platform) <= expected + 2 * (2 * g * (m // g) * k * n)
  else:
    assert compile_stats.jaxpr_flops(grads, platform) == expected
  if impl == "auto":  # on the CPU the tiled kernel runs; it pads each group to whole tiles
    assert compile_stats.jaxpr_flops(jaxpr, "cpu") >= 2 * m * k * n


def test_known_hf_configs_build_the_published_models():
  """The hub ids the configs name build without their checkpoints (abstract shapes only)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from sao.models import known_configs  # pylint: disable=g-import-not-at-top
  from sao.models.transformer import abstract_params  # pylint: disable=g-import-not-at-top
  config = ModelConfig.from_hf(known_configs.hf_config("Qwen/Qwen3-30B-A3B"))
  params = abstract_params(config)
  total = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.meta.unbox(params)))
  assert 30.0e9 < total < 31.0e9 and 2.9e9 < compile_stats.active_params(config, params) < 3.2e9  # "30B-A3B"
  with pytest.raises(ValueError, match="model.hf_path.*no config.json"):
    known_configs.hf_config("/nonexistent/checkpoint")


def test_the_model_follows_the_config_precision():
  config = sao_openswe.get_config("toy,model.param_dtype=bfloat16,model.compute_dtype=bfloat16,model.remat=full")
  model_config = model_config_of(config)
  assert (model_config.param_dtype, model_config.dtype, model_config.remat) == ("bfloat16", "bfloat16", "full")
  assert model_config_of(config, "float32").param_dtype == "float32"  # --model_dtype overrides both
  full = model_config_of(sao_openswe.get_config("full"))  # the shipped full config: bf16, remat (hub id, no weights)
  assert (full.model_type, full.param_dtype, full.dtype, full.remat) == ("qwen3_5_moe_text", "bfloat16", "bfloat16",
                                                                          "full")


def test_truncated_keeps_the_first_layers_and_their_block_types():
  full = model_config_of(sao_openswe.get_config("full"))
  four = truncated(full, 4)
  assert four.num_layers == 4 and four.layer_types == full.layer_types[:4]
  assert four.layer_types.count("full_attention") == 1  # one hybrid period: 3 Gated DeltaNet + 1 attention
  with pytest.raises(ValueError, match="num_layers"):
    truncated(full, 41)


def test_topology_names_are_checked():
  chip, dims = parse_topology("v5p:4x4x8")
  assert chip.hbm_bytes == 95 * GIB and dims == (4, 4, 8)
  with pytest.raises(ValueError, match="topology.*v7x"):
    parse_topology("v7x:2x2x1")


def test_a_compiled_program_larger_than_the_chip_does_not_fit():
  """XLA may compile a program whose buffers exceed the chip: the report goes by the memory analysis."""
  config = _config(sao_openswe, "qwen3_moe", 32)
  model_config = model_config_of(config, "float32")
  tiny_chip = Chip("cpu", "cpu", 1 << 16, 1e12, 1e11, "")
  rows = driver.compile_update(config, model_config, jax.devices("cpu")[:1], tiny_chip, programs=("critic_values",))
  assert [r.program for r in rows] == ["critic_values"]
  (row,) = rows
  assert not row.fits and row.hbm_bytes_per_chip > tiny_chip.hbm_bytes and "compiled, but needs" in row.error


def test_the_recorded_update_has_the_vtrace_programs_and_an_ev_gated_actor_step():
  """With V-trace critic targets and the actor's start gated on the critic's EV, the recorded update still has its
  actor step (the gate is taken as open: an abstract update has no EV) and the V-trace programs (the actor's
  forward log-probs, `vtrace_targets`), and leaves the learner's gate and update count as they were."""
  config = _config(sao_openswe, "qwen3", 32)
  config.unlock()
  config.learner.sao.critic_target_correction = "vtrace"
  config.learner.sao.actor_start = "critic_ev"
  config.lock()
  model_config = model_config_of(config, "float32")
  learner = driver.abstract_learner(config, model_config, jax.devices("cpu")[:1])
  gate = learner.actor_start
  recorded = driver.record_update(learner, driver.precompile.abstract_batch(learner, 8, 32))
  assert {"actor_step_dis", "vtrace_targets", "critic_values", "critic_step"} <= set(recorded), list(recorded)
  assert recorded["vtrace_targets"][2] == 1 and recorded["actor_step_dis"][2] >= 1
  assert learner.actor_start is gate and gate.started_at is None and learner.num_updates == 0


@pytest.mark.slow
def test_update_programs_compile_on_cpu_devices():
  """The recorder and the report on the host's CPU devices (no libtpu): every SAO program, FLOPs in bounds; with a
  value clip the update reads V⁰, so its forward and `critic_targets` are compiled (the TPU test below covers the
  recipe's update without them)."""
  config = _config(sao_openswe, "qwen3_moe", 32)
  config.unlock()
  config.learner.critic.value_clip = 0.2
  config.lock()
  model_config = model_config_of(config, "float32")
  cpu_chip = Chip("cpu", "cpu", 1 << 40, 1e12, 1e11, "", 1e10, 4)  # ICI figures: the pricer needs them
  rows = driver.compile_update(config, model_config, jax.devices("cpu")[:4], cpu_chip)
  _check_rows(rows, SAO_PROGRAMS_WITH_V0, model_config)


@pytest.mark.slow
@needs_libtpu
def test_compile_tpu_reports_every_program_of_sao_and_gspo(tmp_path):
  """The command for a 2-layer qwen3_moe SAO config on a v5p-4 (JSON rows), and a 2-layer qwen3_5_moe_text GSPO
  config through the module."""
  out = tmp_path / "rows.json"
  result = subprocess.run(
      [sys.executable, str(ROOT / "experiments" / "compile_tpu.py"),
       "--config=experiments/configs/sao_openswe.py:toy,rollout.batch_size=8",
       "--config.model.toy.model_type=qwen3_moe",
       "--topology=v5p:2x2x1", "--buckets=64", f"--out={out}"],
      cwd=ROOT, capture_output=True, text=True, timeout=900, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr[-3000:]
  rows = json.loads(out.read_text())
  assert {r["program"] for r in rows} == SAO_PROGRAMS
  for r in rows:
    assert r["topology"] == "v5p:2x2x1" and r["config"] == "sao_openswe_toy" and r["bucket"] == 64
    assert r["hbm_bytes_per_chip"] > 0 and r["hbm_capacity_bytes"] == 95 * GIB
    # The advantage programs have no model FLOPs (analytic 0); the chunked GAE's small triangular matmuls give them
    # some XLA FLOPs all the same. Every model program has both.
    assert r["flops"] > 0 if r["analytic_flops"] > 0 else r["program"] in ADVANTAGE_PROGRAMS
    assert set(r) >= {"analytic_flops", "estimated_seconds", "estimated_mfu", "instruction_seconds"}
    assert r["instruction_seconds"] > 0 and r["instruction_error"] == ""  # every compiled row priced per instruction
    if r["analytic_flops"] > 0:
      assert 0 < r["instruction_mfu"] < 1
  assert "actor_step_dis" in result.stdout
  assert "update at T=64: per-instruction sum" in result.stdout and "XLA-estimated" in result.stdout

  from sao.aot import tpu_topology  # pylint: disable=g-import-not-at-top
  chip, devices = tpu_topology.topology_devices("v5p:2x2x1")
  config = _config(gspo_openswe, "qwen3_5_moe_text", 64)
  model_config = model_config_of(config, "float32")
  _check_rows(driver.compile_update(config, model_config, devices, chip), GSPO_PROGRAMS, model_config)


@needs_libtpu
def test_compile_tpu_exits_nonzero_naming_the_program_that_does_not_fit(tmp_path):
  """A bucket of 2^26 tokens: even with blockwise attention (linear in T) the critic's activations need ~178 GiB of
  temporaries per chip (2^20 fitted once attention stopped materialising `[T, T]` scores). Its row goes to --out; a
  --resume compiles nothing and still exits 1 from the resumed row; a resume for another layer count is refused."""
  out = tmp_path / "rows.json"
  command = [sys.executable, str(ROOT / "experiments" / "compile_tpu.py"),
             "--config=experiments/configs/sao_openswe.py:toy,rollout.batch_size=8", "--topology=v5p:2x2x1",
             "--buckets=67108864", "--programs=critic_values", f"--out={out}"]
  run = lambda *extra: subprocess.run(command + list(extra), cwd=ROOT, capture_output=True, text=True, timeout=900,
                                      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  result = run()
  assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
  assert "does not fit on v5p:2x2x1: critic_values (T=67108864)" in result.stderr
  assert "does not fit: critic_values at T=67108864" in result.stdout  # with the largest buffers below it
  (row,) = json.loads(out.read_text())
  assert (row["program"], row["status"], row["num_layers"]) == ("critic_values", "does_not_fit", 2)
  assert row["compile_seconds"] > 0 and row["peak_rss_bytes"] > 0

  resumed = run("--resume")
  assert resumed.returncode == 1, resumed.stdout[-3000:] + resumed.stderr[-3000:]
  assert "compiled 0 programs" in resumed.stdout and "1 rows resumed" in resumed.stdout
  assert "does not fit on v5p:2x2x1: critic_values (T=67108864)" in resumed.stderr
  refused = run("--resume", "--num_layers=1")
  assert refused.returncode == 2 and "num_layers: file 2, this run 1" in refused.stderr, refused.stderr[-3000:]
