"""Rows per gradient-accumulation micro-batch, per padded length (`learner.batching.micro_batch_size` and
`learner.batching.micro_batch_by_length`).

A step splits its `[B, T]` batch into `B / rows` micro-batches of `rows` rows (`sao.train.steps`). One row count for
every length is a compromise on a pod: the longest bucket fits one row per batch shard, while a short bucket would
run more rows per micro-batch (bigger matmuls, fewer scan iterations; under expert parallelism the micro-batch must
hold one row per `expert` shard too). `micro_batch_by_length = "8192:64,32768:16"` gives a batch padded to T ≤ 8192
64-row micro-batches, T ≤ 32768 16-row ones, and longer ones `micro_batch_size` rows. The steps compile per padded
shape anyway, so each length's programs have their own micro-batch count.
"""
from __future__ import annotations

import dataclasses
import math

KEY = "batching.micro_batch_by_length"


@dataclasses.dataclass(frozen=True)
class MicroBatching:
  """`default` rows (0: the whole batch at once) except for the `(max length, rows)` entries of `by_length`
  (increasing lengths, rows > 0): a batch of length T takes the first entry with max length ≥ T."""
  default: int = 0
  by_length: tuple[tuple[int, int], ...] = ()

  def rows(self, length: int) -> int:
    for max_length, rows in self.by_length:
      if length <= max_length:
        return rows
    return self.default

  def batch_multiple(self, shards: int) -> int:
    """What B is padded to a multiple of: every row count used (the batch shards where one is 0)."""
    return math.lcm(*(rows or shards for rows in (self.default, *(r for _, r in self.by_length))))

  def check_shards(self, shards: int) -> None:
    """Every row count must split over the batch shards (data × fsdp × expert)."""
    for where, rows in (("batching.micro_batch_size", self.default),
                        *((f"{KEY} ({length}:{rows})", rows) for length, rows in self.by_length)):
      if rows and rows % shards:
        raise ValueError(f"{where}: {rows} rows must be a multiple of the batch shards (data×fsdp×expert = {shards})")


def parse(default: int, text: str) -> MicroBatching:
  """`MicroBatching` from the config's `micro_batch_size` and `micro_batch_by_length` ("<max length>:<rows>,…";
  "" for none). A malformed entry, a non-increasing length or rows ≤ 0 is a ValueError naming the key."""
  entries = []
  for item in (part.strip() for part in str(text).split(",")):
    if not item:
      continue
    try:
      length, rows = (int(v) for v in item.split(":"))
    except ValueError:
      raise ValueError(f"{KEY}: {item!r} is not '<max length>:<rows>' (e.g. '8192:64,32768:16')") from None
    if rows <= 0 or length <= 0:
      raise ValueError(f"{KEY}: {item!r}: the length and the rows must be > 0")
    if entries and length <= entries[-1][0]:
      raise ValueError(f"{KEY}: lengths must increase, got {length} after {entries[-1][0]}")
    entries.append((length, rows))
  return MicroBatching(int(default), tuple(entries))
