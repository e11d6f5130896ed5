"""`hlo_cost` prices XLA:TPU's sliced prefetch (`slice-start` of a window of an HBM buffer, often into the core's
memory `S(1)`, then `slice-done`) by the window's bytes at its start and nothing at its done — not by the whole
source buffer each time (which made the 30B's actor step at 32k look 0.8 s slower, docs/tpu_hlo_breakdown.md)."""
from __future__ import annotations

import pytest

from sao.aot import hlo_cost, hlo_text
from sao.aot.tpu_topology import Chip

CHIP = Chip("test", "test", 1 << 30, 1e12, 1e12, "", 6e9, 6)  # 1 TB/s HBM: bytes / 1e12 seconds

MODULE = """HloModule m

ENTRY %main (a: s8[16777216]) -> (s8[4194304], s8[4194304]) {
  %a = s8[16777216]{0:T(1024)(128)(4,1)} parameter(0)
  %slice-start.1 = ((s8[16777216]{0:T(1024)(128)(4,1)}), s8[4194304]{0:T(1024)(128)(4,1)S(1)}, s32[]{:S(2)}) slice-start(%a), slice={[0:4194304]}
  %slice-done.1 = s8[4194304]{0:T(1024)(128)(4,1)S(1)} slice-done(%slice-start.1)
  %slice-start.2 = ((s8[16777216]{0:T(1024)(128)(4,1)}), s8[4194304]{0:T(1024)(128)(4,1)}, s32[]{:S(2)}) slice-start(%a), slice={[4194304:8388608]}
  %slice-done.2 = s8[4194304]{0:T(1024)(128)(4,1)} slice-done(%slice-start.2)
  ROOT %t = (s8[4194304]{0:T(1024)(128)(4,1)S(1)}, s8[4194304]{0:T(1024)(128)(4,1)}) tuple(%slice-done.1, %slice-done.2)
}
"""


def test_a_window_costs_its_bytes_and_the_done_nothing():
  result = hlo_cost.breakdown(hlo_text.parse_module(MODULE), CHIP)
  by_name = {o.name: o for o in result.ops}
  assert set(by_name) == {"slice-start.1", "slice-start.2"}  # the dones are free
  window = 4194304
  assert by_name["slice-start.1"].bytes == window  # read from HBM, written on chip
  assert by_name["slice-start.2"].bytes == 2 * window  # read and written in HBM
  assert by_name["slice-start.1"].kind == "copy/transpose"
  assert result.total() == pytest.approx(3 * window / 1e12)
