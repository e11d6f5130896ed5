"""The base policy a run starts RL from: the configured checkpoint or a fresh toy model, warm-started on demonstrations.

    model.init == "hf":   the checkpoint at `model.hf_path`, streamed into the learner's shardings
    model.init == "toy":  `ModelConfig.tiny(...)` initialised from `config.seed`
        └─ recipe.sft_steps > 0: supervised warm start (actor-only NLL, `phases.sft_config`) on the scripted expert's
           demonstrations ──▶ exported to <workdir>/base_model (HF directory, the trainer's tokenizer with it)

With `sft_steps == 0` a checkpoint is its own base policy (no copy is written); a toy model is exported as it was
initialised. A `<workdir>/base_model` that exists is reused as it is (a re-run or resumed job does not warm-start
again), loaded in the run's precision.

The demonstrations come from the entry point (`launch.run`), rendered by the trainer's tokenizer — the checkpoint's
own, with its chat template, for `init == "hf"` — through the configured harnesses. Process 0 makes them; the other
processes train on its copy (`channel.share`), drawing the same batches from a seeded rng.

This module is the trainer's (`sao.train.trainer.Trainer.base_policy`); it never imports `sao.rollout`.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np
from absl import logging

from sao.models import hf, streaming, transformer
from sao.models.config import ModelConfig
from sao.train import distributed
from sao.train import mesh as mesh_lib
from sao.train import phases
from sao.train.export import export_policy
from sao.transport.trajectory import Trajectory


def base_policy(trainer: Any, demonstrations: Callable[[], Sequence[Trajectory]] | None
                ) -> tuple[ModelConfig, Any, str]:
  """(model config, params, HF directory) of `trainer`'s starting policy (module docstring). `trainer` is a
  `sao.train.trainer.Trainer` (its config, workdir, tokenizer, channel and learner factory are used)."""
  c = trainer.config
  base_dir = os.path.join(trainer.workdir, "base_model")
  # The run config's precision and remat as ModelConfig fields (docs/models.md "Precision"); the loader stores the
  # params in `param_dtype` (its `dtype` argument is the compute dtype, `param_dtype` overrides the storage).
  precision = {"dtype": c.model.get("compute_dtype", "float32"), "param_dtype": c.model.get("param_dtype", "float32"),
               "remat": c.model.get("remat", "none"), "scan_layers": c.model.get("scan_layers", False),
               "moe_capacity_factor": c.model.get("moe_capacity_factor", 0.0),
               "linear_attn_matmul": c.model.get("linear_attn_matmul", "float32"),
               "sequence_parallel": c.model.get("sequence_parallel", False)}
  cached = lambda: os.path.isfile(os.path.join(base_dir, "config.json"))
  if trainer._decide("base_policy", cached):  # pylint: disable=protected-access
    # A cached base policy's config.json holds the architecture only: the run's precision applies as when it was
    # made (a resumed or re-run job must not train the RL phase without its remat / scan / dtypes).
    model_config, params = hf.load_pretrained(base_dir, **precision)
    logging.info("base policy: reusing %s", base_dir)
    return model_config, params, base_dir
  sft_steps = c.get("recipe", {}).get("sft_steps", 0)
  if c.model.init == "hf":
    # Streamed tensor by tensor into the learner's param shardings: the host never holds the whole model.
    model_config, params = streaming.load_pretrained_sharded(
        c.model.hf_path, mesh_lib.make_mesh(dict(c.learner.mesh)), **precision)
    if not sft_steps:
      return model_config, params, c.model.hf_path
    # Kept as the learner's (possibly multi-host) global arrays: `export_policy` writes those shard by shard.
    params = supervised_warm_start(trainer, model_config, params, _shared_demonstrations(trainer, demonstrations),
                                   fetch=False)
  else:
    model_config = ModelConfig.tiny(c.model.toy.model_type, vocab_size=trainer.tokenizer.vocab_size, **precision,
                                    **{k: v for k, v in c.model.toy.items() if k != "model_type"})
    params = transformer.init_params(model_config, jax.random.PRNGKey(c.seed))
    if sft_steps:
      # The toy model is small enough to hold whole on every host.
      params = supervised_warm_start(trainer, model_config, params, _shared_demonstrations(trainer, demonstrations),
                                     fetch=True)
  export_policy(model_config, params, trainer.tokenizer, base_dir)
  return model_config, params, base_dir


def _shared_demonstrations(trainer: Any, demonstrations: Callable[[], Sequence[Trajectory]] | None
                           ) -> list[Trajectory]:
  """Process 0's demonstrations, on every process."""
  if demonstrations is None:
    raise ValueError("recipe.sft_steps > 0 needs demonstrations (the entry point passes them when sft_steps > 0)")
  if trainer.is_coordinator:
    demos = list(demonstrations())
    if not demos:
      raise ValueError(f"recipe.sft_steps = {trainer.config.recipe.sft_steps}: the demonstrations are empty")
    return trainer.channel.share("demonstrations", None, demos).trajectories
  return trainer.channel.share("demonstrations").trajectories


def supervised_warm_start(trainer: Any, model_config: ModelConfig, params: Any, demos: list[Trajectory],
                          fetch: bool) -> Any:
  """`recipe.sft_steps` actor-only NLL updates (`phases.sft_config`) on batches of `recipe.sft_batch_size`
  demonstrations drawn with replacement (rng seeded by `config.seed`); returns the actor's params, fetched to host
  numpy on every process if `fetch`, else the learner's global arrays."""
  r = trainer.config.recipe
  trainer._precompile_ahead(model_config)  # pylint: disable=protected-access
  learner = trainer._learner(  # pylint: disable=protected-access
      phases.sft_config(trainer.config), model_config, params)
  rng = np.random.default_rng(trainer.config.seed)
  start = time.time()
  for step in range(r.sft_steps):
    batch = [demos[i] for i in rng.integers(0, len(demos), r.sft_batch_size)]
    with trainer.channel.busy(f"sft step {step}: update"):
      metrics = learner.sft_update(batch)
    if step % 50 == 0 or step == r.sft_steps - 1:
      line = f"[sft] step {step:4d}  nll {metrics['actor/loss']:.4f}  ({time.time() - start:.0f}s)"
      trainer._print(line)  # pylint: disable=protected-access
  return distributed.fetch(learner.actor_params) if fetch else learner.actor_params
