"""The TPU's async collective fusion in optimized HLO (`--xla_tpu_enable_async_collective_fusion`), as libtpu writes
it: a fusion rooted in the custom call `AsyncCollectiveStart` over a collective, the compute fusions scheduled after
it that carry the same collective (its `channel_id`) along with their own work, and a fusion rooted in
`AsyncCollectiveDone`. Pure parsing (no jax): `hlo_cost` prices the pair, `hlo_overlap` hides it.
"""
from __future__ import annotations

from sao.aot.hlo_text import Computation, Instruction, Module

# Collective opcode → the collective it is (an async start is priced as its collective; `hlo_cost` prices them).
COLLECTIVES = {"all-gather": "all-gather", "all-gather-start": "all-gather", "all-reduce": "all-reduce",
               "all-reduce-start": "all-reduce", "reduce-scatter": "reduce-scatter", "all-to-all": "all-to-all",
               "collective-permute": "collective-permute", "collective-permute-start": "collective-permute",
               "ragged-all-to-all": "all-to-all"}
COLLECTIVE_OPCODES = set(COLLECTIVES)


def _target(inst: Instruction) -> str:
  return (inst.attr("custom_call_target") or "").strip('"') if inst.opcode == "custom-call" else ""


def async_collective_fusion(module: Module, inst: Instruction) -> tuple[str, Instruction] | None:
  """("start" | "done", the collective) when `inst` is the start or the done fusion of an async collective fusion;
  None for any other instruction."""
  if inst.opcode != "fusion":
    return None
  fused = module.computations[inst.called["calls"][0]]
  target = _target(fused.root)
  if target not in ("AsyncCollectiveStart", "AsyncCollectiveDone"):
    return None
  collective = next((i for i in fused.instructions if i.opcode in COLLECTIVE_OPCODES), None)
  return ("start" if target == "AsyncCollectiveStart" else "done", collective) if collective else None


def channel(collective: Instruction) -> str:
  return collective.attr("channel_id") or collective.name


def carried_state(fused: Computation) -> tuple[set[str], set[int]]:
  """(parameters, result indices) of a fusion that carries an async collective along: the collective's state that
  only passes through it (a parameter whose users are the root tuple or the collective, and the root's elements that
  are such parameters or the collective's result). Its data moves over ICI, priced once at the start; empty sets for
  a fusion that holds no collective or whose root is not a tuple."""
  collectives = {i.name for i in fused.instructions if i.opcode in COLLECTIVE_OPCODES}
  if not collectives or fused.root is None or fused.root.opcode != "tuple":
    return set(), set()
  root = fused.root.name
  params = {i.name for i in fused.instructions if i.opcode == "parameter" and
            all(u.name == root or u.name in collectives for u in fused.users.get(i.name, []))}
  results = {k for k, name in enumerate(fused.root.operands) if name in params or name in collectives}
  return params, results
