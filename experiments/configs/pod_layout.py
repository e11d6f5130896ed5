"""How the `full` configs lay the learner out on a pod: precision (bf16 with float32 master weights, per-layer
remat, a scan over layers) and the learner mesh with its micro-batches.

`full_mesh` is what `common.full_scale` ships (it fits every bucket up to 131,072 tokens on a v5p-128);
`full_expert_mesh` is the expert-parallel layout the cost model prices 5× faster at 32,768 tokens but which holds
one row per batch shard and so serves buckets up to 65,536 (docs/tpu_hlo_breakdown.md, "Current numbers").
"""
from __future__ import annotations

import ml_collections

# The longest row `full_expert_mesh` fits: one row per batch shard (docs/tpu_hlo_breakdown.md, "Current numbers").
EXPERT_MESH_MAX_TOKENS = 65536

def full_precision(config: ml_collections.ConfigDict) -> None:
  """bf16 as TPU trainers run it (MaxText, levanter): bf16 parameters and activations in HBM, float32 AdamW moments
  and float32 master weights (the update is applied to the master copy and the bf16 params are its cast: at the
  actor's lr 1e-6 an update is ~1e-6 relative, far below bf16's 2^-8 spacing, so applied to bf16 directly most would
  round away); Gated DeltaNet's chunk matmuls take bf16 operands. Per-layer remat: the backward pass recomputes each
  decoder layer from its input instead of keeping its activations (one layer's [rows, T, hidden] input per layer is
  all that is kept). Scan over layers: the ahead-of-time compile of the full depth takes about one period of layers'
  time (docs/tpu_compile_report.md)."""
  config.model.param_dtype = "bfloat16"
  config.model.compute_dtype = "bfloat16"
  config.model.remat = "full"
  config.model.scan_layers = True
  # Gated DeltaNet's chunk matmuls with bf16 operands (f32 accumulation and state, as flash-linear-attention's
  # kernels): the chunk arrays' HBM traffic halves (docs/tpu_hlo_breakdown.md).
  config.model.linear_attn_matmul = "bfloat16"
  for role in (config.learner.actor, config.learner.critic):
    role.optimizer.master_weights = True


def full_mesh(config: ml_collections.ConfigDict) -> None:
  """The learner mesh for the full configs on a v5p-128 (128 chips; on 256 chips `tensor` doubles): the batch over
  `fsdp` = 8, the model over `tensor` = −1 (the remaining 16), micro-batches of 8 rows — one row per batch shard.

  Why: the batch rule shards rows over data × fsdp × expert, and a micro-batch must split evenly over them, so a
  micro-batch of M rows allows at most M batch shards. One row of 131,072 tokens per chip is already the most a
  chip's activations hold, so more rows per micro-batch only buys more batch shards at the cost of memory; the rest
  of the chips shard the model (heads, expert widths, vocabulary) over `tensor`. The compile report
  (docs/tpu_compile_report.md) measures this layout.

  Sequence parallelism (`model.sequence_parallel`): `tensor` splits each row's tokens between the layers, not its
  hidden units, so a layer's projections multiply their own tokens by gathered weights and the mixers reach their
  heads by all-to-alls, instead of all-gathering and reduce-scattering whole rows over 16 chips in every layer
  (`sao.models.sequence_parallel`; docs/tpu_hlo_breakdown.md, "Sequence parallelism")."""
  c = config.learner
  c.batching.micro_batch_size = 8
  c.mesh.data, c.mesh.fsdp, c.mesh.expert, c.mesh.tensor = 1, 8, 1, -1
  config.model.sequence_parallel = True


def full_expert_mesh(config: ml_collections.ConfigDict) -> None:
  """The expert-parallel learner mesh: the batch over `fsdp` 8 × `expert` 8, the model over `tensor` = −1 (2 on a
  v5p-128, 4 on 256 chips), the 256 experts 32 a shard over `expert`, 64-row micro-batches (one row per batch shard),
  the MoE's rows in chunks of 2 × the balanced share (`model.moe_capacity_factor`, nothing dropped).

  Why: on `full_mesh` every chip's `tensor` group of 16 splits each layer's matmuls 16 ways and at 32,768 tokens the
  MoE runs every expert's 1/16 on every token, so collectives and memory-bound copies hold the step (9.52 s, 9.6 %
  modeled MFU for the SAO actor step at T = 32,768 on a v5p-128 with sequence parallelism, attention counted causal); here the SAO actor step models 3.01 s
  (30.5 %) and the critic step 2.67 s (30.3 %) at 32,768, 40.9 GiB per chip. Its limit: a micro-batch holds one row per batch shard, and a
  131,072-token row per chip pair does not fit (a 4-layer slice needs 103 GiB per chip), so the buckets and the
  episodes stop at `EXPERT_MESH_MAX_TOKENS` (docs/tpu_hlo_breakdown.md)."""
  c = config.learner
  c.batching.micro_batch_size = 64
  c.mesh.data, c.mesh.fsdp, c.mesh.expert, c.mesh.tensor = 1, 8, 8, -1
  config.model.moe_capacity_factor = 2.0
  # The hidden units over `tensor` (2 here): the layout the 32k numbers of docs/tpu_hlo_breakdown.md were measured in.
  config.model.sequence_parallel = False
  c.batching.bucket_lengths = tuple(b for b in c.batching.bucket_lengths if b <= EXPERT_MESH_MAX_TOKENS)
  config.rollout.max_total_tokens = min(config.rollout.max_total_tokens, EXPERT_MESH_MAX_TOKENS)
