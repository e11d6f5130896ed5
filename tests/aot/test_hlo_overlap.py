"""`sao.aot.hlo_overlap`: hand-written scheduled HLO where what the schedule hides is exact arithmetic.

Prices (the chip of tests/aot/test_hlo_cost.py): HBM 1 TB/s, an ICI ring of 1 GB/s, groups of 2 chips. Compute
`E(k)` is an f32 exponential of 125,000·k elements: 8 bytes an element through HBM, k µs. A collective-permute of
f32[250·k] is k µs (its operand over the ring), an all-gather-start of f32[250·k] → f32[500·k] k µs ((n−1)/n of
the result), an all-reduce of f32[250·k] k µs (2(n−1)/n of the operand), a reduce-scatter of f32[500·k] k µs.
Every case also checks that `serial` is hlo_cost's serial sum, unchanged."""
from __future__ import annotations

import pytest

from sao.aot import hlo_cost, hlo_overlap, hlo_text
from sao.aot.tpu_topology import Chip

CHIP = Chip("test", "test", 1 << 30, 1e12, 1e12, "", 6e9, 6)
US = 1e-6
TOL = 1e-9  # the loop counter and condition cost ~1e-10 s in all; a wrong rule is off by ≥ 1 µs

SUM = """%sum (sx: f32[], sy: f32[]) -> f32[] {
  %sx = f32[] parameter(0)
  %sy = f32[] parameter(1)
  ROOT %add.s = f32[] add(%sx, %sy)
}

%wrapped_rs (w0: f32[1000]) -> f32[500] {
  %w0 = f32[1000]{0} parameter(0)
  ROOT %rs = f32[500]{0} reduce-scatter(%w0), channel_id=9, replica_groups={{0,1}}, dimensions={0}, to_apply=%sum
}
"""


class Program:
  """Straight-line HLO written as a list of steps; each step knows its own inputs (parameters of the entry)."""

  def __init__(self):
    self.params: dict[str, str] = {}
    self.lines: list[str] = []
    self.n = 0

  def _param(self, elements: int) -> str:
    name = f"x{elements}"
    self.params.setdefault(name, f"f32[{elements}]")
    return name

  def _name(self, stem: str) -> str:
    self.n += 1
    return f"{stem}.{self.n}"

  def compute(self, k: float) -> str:
    x, name = self._param(int(125_000 * k)), self._name("exp")
    self.lines.append(f"%{name} = f32[{int(125_000 * k)}]{{0}} exponential(%{x})")
    return name

  def permute_start(self, k: float) -> str:
    x, name = self._param(int(250 * k)), self._name("cp")
    shape = f"f32[{int(250 * k)}]{{0}}"
    self.lines.append(f"%{name} = ({shape}, {shape}, u32[], u32[]) collective-permute-start(%{x}), channel_id=1, "
                      "source_target_pairs={{0,1},{1,0}}")
    return name

  def gather_start(self, k: float) -> str:
    x, name = self._param(int(250 * k)), self._name("ag")
    self.lines.append(f"%{name} = (f32[{int(250 * k)}]{{0}}, f32[{int(500 * k)}]{{0}}) all-gather-start(%{x}), "
                      "channel_id=2, replica_groups={{0,1}}, dimensions={0}")
    return name

  def reduce_scatter_start(self) -> str:  # 2 µs, an async-start wrapping a reduce-scatter
    x, name = self._param(1000), self._name("rs")
    self.lines.append(f"%{name} = ((f32[1000]{{0}}), f32[500]{{0}}) async-start(%{x}), calls=%wrapped_rs")
    return name

  def done(self, start: str) -> None:
    opcode = {"cp": "collective-permute-done", "ag": "all-gather-done", "rs": "async-done"}[start.split(".")[0]]
    self.lines.append(f"%{start}.done = f32[1]{{0}} {opcode}(%{start})")

  def all_reduce(self, k: float) -> None:  # synchronous
    x = self._param(int(250 * k))
    self.lines.append(f"%{self._name('ar')} = f32[{int(250 * k)}]{{0}} all-reduce(%{x}), channel_id=3, "
                      "replica_groups={{0,1}}, to_apply=%sum")

  def computation(self, header: str) -> str:
    params = [f"%{name} = {shape}{{0}} parameter({i})" for i, (name, shape) in enumerate(self.params.items())]
    body = params + self.lines + ["ROOT %out = () tuple()"]
    return header + " {\n" + "\n".join("  " + line for line in body) + "\n}\n"

  def module(self) -> str:
    signature = ", ".join(f"{name}: {shape}" for name, shape in self.params.items())
    return "HloModule m, is_scheduled=true\n\n" + SUM + "\n" + self.computation(f"ENTRY %main ({signature}) -> ()")


def priced(text: str) -> hlo_overlap.Overlap:
  module = hlo_text.parse_module(text)
  result = hlo_overlap.overlap(module, CHIP)
  assert result.serial == pytest.approx(hlo_cost.breakdown(module, CHIP).total(), rel=1e-12)
  return result


def straight(*steps) -> hlo_overlap.Overlap:
  """`steps`: ("E", k), ("cp", k) / ("ag", k) / ("rs",) starts (named by their order), ("done", i), ("ar", k)."""
  program, starts = Program(), []
  for step in steps:
    if step[0] == "E":
      program.compute(step[1])
    elif step[0] == "cp":
      starts.append(program.permute_start(step[1]))
    elif step[0] == "ag":
      starts.append(program.gather_start(step[1]))
    elif step[0] == "rs":
      starts.append(program.reduce_scatter_start())
    elif step[0] == "done":
      program.done(starts[step[1]])
    elif step[0] == "ar":
      program.all_reduce(step[1])
  return priced(program.module())


def test_no_compute_between_hides_nothing():
  result = straight(("E", 4), ("cp", 2), ("done", 0), ("E", 3))
  assert result.serial == pytest.approx(9 * US)
  assert result.hidden_total == 0 and result.overlapped == pytest.approx(9 * US)
  assert result.async_seconds == {"collective-permute": pytest.approx(2 * US)} and result.async_pairs == 1


def test_longer_compute_hides_all_of_it():
  result = straight(("cp", 2), ("E", 3), ("done", 0))
  assert result.hidden == {"collective-permute": pytest.approx(2 * US)}
  assert result.overlapped == pytest.approx(3 * US) and result.spare == pytest.approx(1 * US)


def test_shorter_compute_hides_part_and_compute_before_the_start_none():
  result = straight(("E", 5), ("cp", 2), ("E", 1), ("done", 0))
  assert result.hidden_total == pytest.approx(1 * US) and result.overlapped == pytest.approx(7 * US)


def test_two_collectives_over_one_compute_region_count_it_once():
  # 1 µs all-gather and 2 µs permute in flight over 2 µs of compute: 2 µs hidden, not 3.
  result = straight(("ag", 1), ("cp", 2), ("E", 2), ("done", 1), ("done", 0))
  assert result.hidden_total == pytest.approx(2 * US) and result.overlapped == pytest.approx(3 * US)
  # The earliest done is served first: the permute, which the compute stream waits for first.
  assert result.hidden == {"collective-permute": pytest.approx(2 * US), "all-gather": 0}


def test_earliest_done_first_hides_both_where_first_started_first_would_not():
  # A starts, B starts, 1 µs, B done, 1 µs, A done: B takes the first µs, A the second (2 µs hidden); giving the
  # first µs to A (started first) would leave B exposed and the second µs unused.
  result = straight(("cp", 1), ("ag", 1), ("E", 1), ("done", 1), ("E", 1), ("done", 0))
  assert result.hidden == {"collective-permute": pytest.approx(1 * US), "all-gather": pytest.approx(1 * US)}


def test_synchronous_collectives_are_never_hidden_and_hide_nothing():
  result = straight(("E", 3), ("ar", 1))  # compute before it does not matter
  assert result.hidden_total == 0 and result.overlapped == pytest.approx(4 * US)
  assert result.sync_seconds == {"all-reduce": pytest.approx(1 * US)}
  # A synchronous all-reduce inside a permute's window is no compute: the permute stays exposed.
  result = straight(("cp", 2), ("ar", 3), ("done", 0))
  assert result.hidden_total == 0 and result.overlapped == pytest.approx(5 * US)


def test_async_start_wrapping_a_reduce_scatter():
  result = straight(("rs",), ("E", 1), ("done", 0))  # 2 µs in flight over 1 µs
  assert result.async_seconds == {"reduce-scatter": pytest.approx(2 * US)} and not result.sync_seconds
  assert result.hidden == {"reduce-scatter": pytest.approx(1 * US)} and result.overlapped == pytest.approx(2 * US)


def test_a_start_with_no_done_here_is_hidden_by_what_follows_only():
  program = Program()
  program.compute(3)
  program.permute_start(2)
  program.compute(1)
  result = priced(program.module())
  assert result.hidden_total == pytest.approx(1 * US)


# A loop of 5 trips whose counter and condition are priced too (scalars: ~1e-11 s each, within TOL).
def loop_module(body: Program, outer: Program, loop_at: int) -> str:
  """`outer`'s steps with a 5-trip while over `body`'s steps inserted after its `loop_at` first steps."""
  body_params = list(body.params.items())
  state = "(s32[]" + "".join(f", {shape}{{0}}" for _, shape in body_params) + ")"
  gtes = [f"%{name} = {shape}{{0}} get-tuple-element(%p), index={i + 1}" for i, (name, shape) in
          enumerate(body_params)]
  body_lines = ([f"%p = {state} parameter(0)", "%i = s32[] get-tuple-element(%p), index=0", "%one = s32[] constant(1)",
                 "%next = s32[] add(%i, %one)"] + gtes + body.lines +
                [f"ROOT %t = {state} tuple(%next" + "".join(f", %{n}" for n, _ in body_params) + ")"])
  cond_lines = [f"%q = {state} parameter(0)", "%j = s32[] get-tuple-element(%q), index=0",
                "%n = s32[] constant(5)", "ROOT %lt = pred[] compare(%j, %n), direction=LT"]
  for name, shape in body_params:
    outer.params.setdefault(name, shape)
  loop = ["%zero = s32[] constant(0)",
          f"%init = {state} tuple(%zero" + "".join(f", %{n}" for n, _ in body_params) + ")",
          f"%loop = {state} while(%init), condition=%cond, body=%body"]
  outer.lines[loop_at:loop_at] = loop
  text = outer.module()
  block = lambda name, lines: f"%{name} (a: {state}) -> {state if name == 'body' else 'pred[]'} {{\n" + \
      "\n".join("  " + line for line in lines) + "\n}\n\n"
  return text.replace(SUM, SUM + "\n" + block("body", body_lines) + block("cond", cond_lines))


def test_while_body_multiplied_by_its_trip_count():
  body = Program()
  start = body.permute_start(2)
  body.compute(1)
  body.done(start)
  body.compute(1)
  result = priced(loop_module(body, Program(), 0))
  assert result.async_pairs == 5 and result.hidden_total == pytest.approx(5 * US, abs=TOL)
  assert result.serial == pytest.approx(20 * US, abs=TOL) and result.overlapped == pytest.approx(15 * US, abs=TOL)


def test_loop_inside_a_window_offers_only_the_compute_its_own_collectives_left():
  body = Program()
  body.compute(1)
  outer = Program()
  start = outer.permute_start(3)
  outer.done(start)
  result = priced(loop_module(body, outer, 1))  # start; loop of 5 × 1 µs; done
  assert result.hidden_total == pytest.approx(3 * US, abs=TOL)
  busy = Program()  # each trip's 1 µs already hides the trip's own 1 µs permute: nothing is left for the outer one
  inner = busy.permute_start(1)
  busy.compute(1)
  busy.done(inner)
  outer = Program()
  start = outer.permute_start(3)
  outer.done(start)
  result = priced(loop_module(busy, outer, 1))
  assert result.hidden_total == pytest.approx(5 * US, abs=TOL)  # the inner five, none of the outer
  assert result.overlapped == pytest.approx(8 * US, abs=TOL)


def test_breakdown_prints_the_schedule_aware_column():
  from experiments.bench import hlo_breakdown  # pylint: disable=g-import-not-at-top
  slow = Chip("slow", "slow", 1 << 30, 1e12, 1e6, "", 6e3, 6)  # CHIP a million times slower: µs become s
  program = Program()
  start = program.permute_start(2)
  program.compute(1)
  program.done(start)
  program.all_reduce(3)
  module = hlo_text.parse_module(program.module())
  result, overlap = hlo_cost.breakdown(module, slow), hlo_overlap.overlap(module, slow)
  text = hlo_breakdown.format_breakdown(result, slow, 1, 0.0, None, top=3, overlap=overlap)
  lines = text.splitlines()
  serial = next(i for i, line in enumerate(lines) if "time, Σ instructions" in line)
  assert lines[serial].split()[3] == "6.000"
  assert lines[serial + 1].split()[:4] == ["time,", "schedule-aware", "5.000", "s"]
  assert "less 1.000 s" in lines[serial + 1]
  table = text.split("\ncollectives ")[1].splitlines()
  assert table[1].split() == ["all-reduce", "0.0000", "0.0000", "0.0000", "3.0000"]
  assert table[2].split() == ["collective-permute", "2.0000", "1.0000", "1.0000", "0.0000"]
  assert table[3].split() == ["all", "2.0000", "1.0000", "1.0000", "3.0000"]


# The TPU's async collective fusion (`--xla_tpu_enable_async_collective_fusion`), as libtpu 0.0.42.1 writes it: a
# start fusion rooted in `AsyncCollectiveStart`, a compute fusion that carries the collective (its channel) along,
# and a done fusion rooted in `AsyncCollectiveDone`. The all-gather f32[250] → f32[500] is 1 µs.
FUSED_GATHER = """HloModule m, is_scheduled=true

%start_comp (s0: f32[250]) -> (f32[250], f32[500], u32[]) {
  %s0 = f32[250]{0} parameter(0)
  %ag.s = f32[500]{0} all-gather(%s0), channel_id=7, replica_groups={{0,1}}, dimensions={0}
  ROOT %cc.s = (f32[250]{0}, f32[500]{0}, u32[]) custom-call(%ag.s), custom_call_target="AsyncCollectiveStart"
}

%carry_comp (c0: f32[250], c1: f32[500], c2: u32[], c3: f32[N]) -> (f32[N], f32[250], f32[500], u32[]) {
  %c0 = f32[250]{0} parameter(0)
  %c1 = f32[500]{0} parameter(1)
  %c2 = u32[] parameter(2)
  %c3 = f32[N]{0} parameter(3)
  %ag.c = f32[500]{0} all-gather(%c0), channel_id=7, replica_groups={{0,1}}, dimensions={0}
  %e = f32[N]{0} exponential(%c3)
  ROOT %t = (f32[N]{0}, f32[250]{0}, f32[500]{0}, u32[]) tuple(%e, %c0, %ag.c, %c2)
}

%done_comp (d0: f32[250], d1: f32[500], d2: u32[]) -> f32[500] {
  %d0 = f32[250]{0} parameter(0)
  %d1 = f32[500]{0} parameter(1)
  %d2 = u32[] parameter(2)
  %ag.d = f32[500]{0} all-gather(%d0), channel_id=7, replica_groups={{0,1}}, dimensions={0}
  ROOT %cc.d = f32[500]{0} custom-call(%d0, %d1, %ag.d, %d2), custom_call_target="AsyncCollectiveDone"
}

ENTRY %main (x: f32[250], y: f32[N]) -> (f32[500], f32[N]) {
  %x = f32[250]{0} parameter(0)
  %y = f32[N]{0} parameter(1)
  %start = (f32[250]{0}, f32[500]{0}, u32[]) fusion(%x), kind=kCustom, calls=%start_comp
  %g0 = f32[250]{0} get-tuple-element(%start), index=0
  %g1 = f32[500]{0} get-tuple-element(%start), index=1
  %g2 = u32[] get-tuple-element(%start), index=2
  %carry = (f32[N]{0}, f32[250]{0}, f32[500]{0}, u32[]) fusion(%g0, %g1, %g2, %y), kind=kCustom, calls=%carry_comp
  %h0 = f32[250]{0} get-tuple-element(%carry), index=1
  %h1 = f32[500]{0} get-tuple-element(%carry), index=2
  %h2 = u32[] get-tuple-element(%carry), index=3
  %done = f32[500]{0} fusion(%h0, %h1, %h2), kind=kCustom, calls=%done_comp
  %after = f32[N]{0} exponential(%y)
  ROOT %out = (f32[500]{0}, f32[N]{0}) tuple(%done, %after)
}
"""


@pytest.mark.parametrize("n", [250_000, 25_000])
def test_async_collective_fusion(n):
  module = hlo_text.parse_module(FUSED_GATHER.replace("[N]", f"[{n}]"))
  ops = {o.name: o for o in hlo_cost.breakdown(module, CHIP).ops}
  assert set(ops) == {"start", "carry", "after"}  # the done is free
  assert (ops["start"].kind, ops["start"].detail) == ("collective", "all-gather")
  assert ops["start"].seconds == pytest.approx(1 * US)
  # The carrying fusion is charged its own work (the exponential), not the collective's state it passes along.
  carry = 2 * 4 * n / 1e12
  assert ops["carry"].seconds == pytest.approx(carry)
  result = priced(FUSED_GATHER.replace("[N]", f"[{n}]"))
  assert result.async_seconds == {"all-gather": pytest.approx(1 * US)} and not result.sync_seconds
  assert result.hidden == {"all-gather": pytest.approx(min(1 * US, carry))}  # 2 µs of compute, then 0.2
  assert result.overlapped == pytest.approx(max(1 * US, carry) + ops["after"].seconds)  # after the done: no help


def test_a_fusion_holding_a_synchronous_collective_hides_nothing():
  """The TPU's all-reduce-scatter fusion (an all-reduce and its slice, fused) inside a permute's window: synchronous,
  so the permute stays exposed, and the fusion is named by what it does."""
  program = Program()
  start = program.permute_start(1)
  x = program._param(1000)  # pylint: disable=protected-access
  program.lines.append(f"%ars = f32[500]{{0}} fusion(%{x}), kind=kCustom, calls=%all_reduce_scatter")
  program.done(start)
  text = program.module().replace(SUM, SUM + """
%all_reduce_scatter (r0: f32[1000]) -> f32[500] {
  %r0 = f32[1000]{0} parameter(0)
  %inner = f32[1000]{0} bitcast(%r0)
  %ar = f32[1000]{0} all-reduce(%inner), channel_id=5, replica_groups={{0,1}}, to_apply=%sum
  %zero = s32[] constant(0)
  %offset = s32[] partition-id()
  ROOT %rs = f32[500]{0} dynamic-slice(%ar, %offset), dynamic_slice_sizes={500}
}
""")
  result = priced(text)
  assert result.hidden_total == 0 and list(result.sync_seconds) == ["reduce-scatter fusion"]
  assert result.overlapped == pytest.approx(result.serial)


def test_async_collective_fusion_carried_inside_a_call():
  """The carrying fusion one call down from the start and the done: still compute under the collective."""
  n = 25_000
  text = FUSED_GATHER.replace("[N]", f"[{n}]").replace(
      "fusion(%g0, %g1, %g2, %y), kind=kCustom, calls=%carry_comp", "call(%g0, %g1, %g2, %y), to_apply=%wrap")
  wrap = f"""%wrap (w0: f32[250], w1: f32[500], w2: u32[], w3: f32[{n}]) -> (f32[{n}], f32[250], f32[500], u32[]) {{
  %w0 = f32[250]{{0}} parameter(0)
  %w1 = f32[500]{{0}} parameter(1)
  %w2 = u32[] parameter(2)
  %w3 = f32[{n}]{{0}} parameter(3)
  ROOT %inner = (f32[{n}]{{0}}, f32[250]{{0}}, f32[500]{{0}}, u32[]) fusion(%w0, %w1, %w2, %w3), kind=kCustom, calls=%carry_comp
}}

"""
  result = priced(text.replace("ENTRY", wrap + "ENTRY"))
  assert not result.sync_seconds and result.hidden == {"all-gather": pytest.approx(2 * 4 * n / 1e12)}
