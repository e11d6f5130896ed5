"""The per-instruction serial time of a compiled program, the measure issue 44's targets are stated in.

Every executed instruction of the program's optimized, partitioned HLO priced on the chip's roofline with loops
multiplied out (`hlo_cost.breakdown`), then summed: a serial upper bound that hides no collective behind compute
(docs/tpu_hlo_breakdown.md). The compile report records it on each row beside XLA's own estimate, because XLA's
`cost_analysis()` counts no FLOPs inside custom calls — the Pallas kernels of splash attention and megablox — so at
long buckets its roofline prices attention as free and implies more than 100 % MFU; `hlo_cost` prices those kernels
by their own FLOP models.

The MoE's megablox grouped matmuls are priced by the rows of the shard's own experts (`grouped_row_share`): with
expert parallelism over E shards and no capacity chunks, 1/E of the gathered rows; with chunks of c × the balanced
share, 1/c of a chunk's rows (balanced routing); without expert parallelism, every row (1, the kernels' own bound).
"""
from __future__ import annotations

from sao.aot import hlo_cost, hlo_text
from sao.aot.tpu_topology import Chip


def grouped_row_share(expert_shards: int, capacity_factor: float) -> tuple[float, str]:
  """(share of a megablox call's rows in its local groups, how it was chosen): 1/E of the every-row path's E×
  gathered rows; 1/c of a capacity chunk's rows (a chunk holds c × the balanced share); 1 without expert parallelism."""
  if expert_shards < 1 or capacity_factor < 0:
    raise ValueError(f"expert shards {expert_shards} / MoE capacity factor {capacity_factor}: out of range "
                     f"(shards >= 1, factor >= 0)")
  if expert_shards > 1 and capacity_factor > 0:
    return min(1.0, 1.0 / capacity_factor), f"1/{capacity_factor:g} of a chunk's rows (capacity {capacity_factor:g})"
  if expert_shards > 1:
    return 1.0 / expert_shards, f"1/{expert_shards} of their rows"
  return 1.0, ""


def serial_seconds(text: str, chip: Chip, row_share: float = 1.0) -> float:
  """Σ over the executed instructions of the HLO module `text` of count × seconds on `chip` (per chip, one call)."""
  return hlo_cost.breakdown(hlo_text.parse_module(text), chip, row_share).total()
