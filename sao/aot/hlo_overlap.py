"""What a compiled program's schedule hides: `sao.aot.hlo_cost`'s serial per-instruction sum, with the time of each
async collective that runs concurrently with the compute scheduled between its start and its done taken off.

Pure parsing and arithmetic (no jax); the same prices as `hlo_cost` (`hlo_cost.price`), so `serial` here is
`hlo_cost.breakdown(...).total()` and the estimate `serial − hidden` is beside it, never instead of it.

An optimized module is scheduled (`is_scheduled=true`): each computation lists its instructions in the order they
run. An async collective is a pair, `all-gather-start` / `all-reduce-start` / `collective-permute-start` and its
`…-done`, or an `async-start` whose called computation holds a collective (reduce-scatter, all-to-all, …) and its
`async-done`, or the TPU's async collective fusion (`--xla_tpu_enable_async_collective_fusion`: a fusion whose root
is the custom call `AsyncCollectiveStart`, the compute fusions that carry the collective along, and a fusion rooted
in `AsyncCollectiveDone`, matched by the collective's channel); the data moves between start and done while the
instructions scheduled between them run. Every other collective (a plain `all-gather`, `all-reduce`, `all-to-all`,
and a fusion that holds one, as the TPU's `all-reduce-scatter` fusions) is synchronous: never hidden, and no compute
runs during it.

The rule, one execution of a computation walked in schedule order, as a machine with one compute stream and one
interconnect that carries one collective at a time:

- a compute instruction of `t` seconds (anything priced that is not a collective; a nested `while` / `call` /
  conditional offers the compute its own collectives have not used) hides up to `t` seconds of the collectives in
  flight, earliest `done` first: each second of compute hides at most one second of collective, however many are in
  flight (they share the links);
- at its `done`, what is left of a collective is exposed (the compute stream waits for it), and the rest is hidden;
  a start whose done is not in the same computation (a collective carried across loop iterations) is hidden only by
  the compute after it up to the end of the computation;
- loops and calls multiply as in the serial sum (`while`: trip count × body, trip count + 1 × condition; a
  conditional: the branch with the largest serial time).

So hidden ≤ min(collective, compute between its start and done) for every pair, and for any set of pairs in flight
together hidden ≤ the compute under them. It is conservative where it counts compute once and the links as one
(collectives over different torus axes could also overlap each other) and where it gives a collective no credit
for the compute before its start; it is optimistic in that compute runs at its roofline while a collective moves
data (the collective's HBM traffic and any reduction it does on the core are not charged to the compute).
"""
from __future__ import annotations

import collections
import dataclasses
from typing import TYPE_CHECKING

from sao.aot import hlo_cost
from sao.aot.hlo_async import COLLECTIVE_OPCODES, async_collective_fusion, channel as _channel
from sao.aot.hlo_text import Computation, Instruction, Module, read_module, trip_count

if TYPE_CHECKING:
  from sao.aot.tpu_topology import Chip

ASYNC_STARTS = {"all-gather-start", "all-reduce-start", "collective-permute-start"}


@dataclasses.dataclass
class Overlap:
  """Seconds of one run of a program (or one execution of a computation), per chip."""
  serial: float = 0.0  # Σ instructions: hlo_cost's serial sum
  hidden: dict[str, float] = dataclasses.field(default_factory=collections.Counter)  # collective → seconds hidden
  async_seconds: dict[str, float] = dataclasses.field(default_factory=collections.Counter)  # async collectives' time
  sync_seconds: dict[str, float] = dataclasses.field(default_factory=collections.Counter)  # synchronous ones'
  spare: float = 0.0  # compute seconds that hid nothing (what a window around this computation may still use)
  async_pairs: float = 0.0  # async collectives executed (loops multiplied out)

  @property
  def hidden_total(self) -> float:
    return sum(self.hidden.values())

  @property
  def overlapped(self) -> float:
    """The schedule-aware estimate: serial − hidden."""
    return self.serial - self.hidden_total

  def add(self, other: Overlap, times: float) -> float:
    """Adds `times` executions of `other`; returns the compute they offer to the windows around them."""
    self.serial += times * other.serial
    for mine, theirs in ((self.hidden, other.hidden), (self.async_seconds, other.async_seconds),
                         (self.sync_seconds, other.sync_seconds)):
      for kind, seconds in theirs.items():
        mine[kind] += times * seconds
    self.async_pairs += times * other.async_pairs
    return times * other.spare


def _holds_collective(module: Module, comp: Computation) -> bool:
  """Whether a (fused) computation holds a collective, looking into nested fusions."""
  for inst in comp.instructions:
    if inst.opcode in COLLECTIVE_OPCODES:
      return True
    if inst.opcode == "fusion" and _holds_collective(module, module.computations[inst.called["calls"][0]]):
      return True
  return False


def _collective_kind(module: Module, comp: Computation) -> str:
  """The collective a computation holds (`reduce-scatter` for an all-reduce whose result the root slices)."""
  root = comp.root
  if root.opcode == "dynamic-slice" and comp.by_name[root.operands[0]].opcode in ("all-reduce", "all-reduce-start"):
    return "reduce-scatter"
  for inst in comp.instructions:
    if inst.opcode in COLLECTIVE_OPCODES:
      return hlo_cost.COLLECTIVES[inst.opcode]
    if inst.opcode == "fusion" and _holds_collective(module, module.computations[inst.called["calls"][0]]):
      return _collective_kind(module, module.computations[inst.called["calls"][0]])
  return "other"


def _channel_in(module: Module, fusion: Instruction, channels) -> bool:
  """Whether a fusion carries a collective in flight (a continuation fusion of an async collective fusion)."""
  if not channels:
    return False
  fused = module.computations[fusion.called["calls"][0]]
  return any(_channel(i) in channels for i in fused.instructions if i.opcode in hlo_cost.COLLECTIVES)


class _Walker:
  def __init__(self, module: Module, chip: Chip, grouped_row_share: float):
    self.module, self.chip, self.share = module, chip, grouped_row_share
    self.memo: dict[str, Overlap] = {}
    self.unknown = collections.Counter()  # custom calls with no FLOP model (hlo_cost lists them)
    self.holds: dict[str, bool] = {}  # fused computation → holds a collective
    # The channels of every async collective fusion: a fusion that holds one of them carries it (compute), wherever
    # its start is (an outer computation's start is hidden by a loop body's carrying fusions).
    self.async_channels = {_channel(pair[1]) for comp in module.computations.values() for inst in comp.instructions
                           if (pair := async_collective_fusion(module, inst)) and pair[0] == "start"}

  def holds_collective(self, name: str) -> bool:
    if name not in self.holds:
      self.holds[name] = _holds_collective(self.module, self.module.computations[name])
    return self.holds[name]

  def computation(self, name: str) -> Overlap:
    if name not in self.memo:
      self.memo[name] = self._walk(self.module.computations[name])
    return self.memo[name]

  def _done_position(self, comp: Computation, start: Instruction, positions: dict[str, int]) -> int:
    dones = [positions[u.name] for u in comp.users.get(start.name, []) if u.opcode.endswith("-done")]
    return min(dones) if dones else len(comp.instructions)

  def _fusion_done_position(self, comp: Computation, start: Instruction, collective: Instruction,
                            positions: dict[str, int]) -> int:
    """Where the async collective fusion begun by `start` ends: the next done fusion of its channel."""
    for inst in comp.instructions[positions[start.name] + 1:]:
      pair = async_collective_fusion(self.module, inst)
      if pair and pair[0] == "done" and _channel(pair[1]) == _channel(collective):
        return positions[inst.name]
    return len(comp.instructions)

  def _walk(self, comp: Computation) -> Overlap:
    out = Overlap()
    positions = {inst.name: i for i, inst in enumerate(comp.instructions)}
    in_flight: dict[str, list] = {}  # start → [seconds left, position of its done, kind, seconds]

    def hide(compute: float) -> None:
      for key in sorted(in_flight, key=lambda k: in_flight[k][1]):  # earliest done first
        if compute <= 0:
          break
        taken = min(compute, in_flight[key][0])
        in_flight[key][0] -= taken
        compute -= taken
      out.spare += compute

    def land(key: str) -> None:
      left, _, kind, seconds = in_flight.pop(key)
      out.hidden[kind] += seconds - left

    def launch(inst: Instruction, seconds: float, kind: str) -> None:
      out.serial += seconds
      out.async_seconds[kind] += seconds
      out.async_pairs += 1
      in_flight[inst.name] = [seconds, self._done_position(comp, inst, positions), kind, seconds]

    channels: dict[str, str] = {}  # an async collective fusion's channel → its start, while in flight

    for inst in comp.instructions:
      op = inst.opcode
      pair = async_collective_fusion(self.module, inst)
      if pair and pair[0] == "start":
        cost = hlo_cost.price(self.module, comp, inst, self.chip, 1.0, self.unknown, self.share)
        launch(inst, cost.seconds, cost.detail)
        channels[_channel(pair[1])] = inst.name
        in_flight[inst.name][1] = self._fusion_done_position(comp, inst, pair[1], positions)
      elif pair:  # its done
        if _channel(pair[1]) in channels:
          land(channels.pop(_channel(pair[1])))
      elif op == "fusion" and _channel_in(self.module, inst, channels):
        seconds = hlo_cost.price(self.module, comp, inst, self.chip, 1.0, self.unknown, self.share).seconds
        out.serial += seconds
        hide(seconds)  # compute that carries the collective along (a continuation fusion)
      elif op.endswith("-done") and inst.operands and inst.operands[0] in in_flight:
        land(inst.operands[0])
        if not hlo_cost.is_free(inst):  # e.g. slice-done, which the serial sum prices
          self._leaf(comp, inst, out, hide)
      elif op == "while":
        trips, _ = trip_count(self.module, comp, inst)
        trips = 1 if trips is None else trips
        hide(out.add(self.computation(inst.called["body"][0]), trips) +
             out.add(self.computation(inst.called["condition"][0]), trips + 1))
      elif op == "conditional":
        names = inst.called.get("branch_computations") or (inst.called.get("true_computation", []) +
                                                           inst.called.get("false_computation", []))
        if names:
          branches = [self.computation(name) for name in names]
          hide(out.add(max(branches, key=lambda b: b.serial), 1))
      elif op == "async-start" and any(self.holds_collective(name) for name in inst.called.get("calls", [])):
        wrapped = [self.computation(name) for name in inst.called["calls"]]
        collective = sum(sum(w.sync_seconds.values()) for w in wrapped)
        out.serial += sum(w.serial for w in wrapped) - collective  # any plumbing around the collective, serial
        # The wrapped collective is in flight until its async-done.
        launch(inst, collective, _collective_kind(self.module, self.module.computations[inst.called["calls"][0]]))
      elif op in ("call", "async-start", "call-start"):
        for key in ("calls", "to_apply"):
          for name in inst.called.get(key, []):
            hide(out.add(self.computation(name), 1))
      elif hlo_cost.is_free(inst):
        continue
      elif op in ASYNC_STARTS:
        cost = hlo_cost.price(self.module, comp, inst, self.chip, 1.0, self.unknown, self.share)
        launch(inst, cost.seconds, cost.detail)
      else:
        self._leaf(comp, inst, out, hide)
    for key in list(in_flight):  # started, never done here: hidden by what followed it
      land(key)
    return out

  def _leaf(self, comp: Computation, inst: Instruction, out: Overlap, hide) -> None:
    cost = hlo_cost.price(self.module, comp, inst, self.chip, 1.0, self.unknown, self.share)
    out.serial += cost.seconds
    if cost.kind == "collective":
      out.sync_seconds[cost.detail] += cost.seconds
    elif inst.opcode == "fusion" and self.holds_collective(inst.called["calls"][0]) and \
        not _channel_in(self.module, inst, self.async_channels):
      # A collective fusion (the TPU's all-reduce-scatter): hlo_cost prices it by its HBM bytes; it runs
      # synchronously on the links, so it hides nothing.
      fused = self.module.computations[inst.called["calls"][0]]
      out.sync_seconds[_collective_kind(self.module, fused) + " fusion"] += cost.seconds
    else:
      hide(cost.seconds)


def overlap(module: Module, chip: Chip, grouped_row_share: float = 1.0) -> Overlap:
  """The serial sum of `module` on `chip` and what its schedule hides of it (see the module docstring);
  `grouped_row_share` as in `hlo_cost.breakdown`."""
  return _Walker(module, chip, grouped_row_share).computation(module.entry)


def overlap_of_file(path: str, chip: Chip, grouped_row_share: float = 1.0) -> Overlap:
  return overlap(read_module(path), chip, grouped_row_share)
