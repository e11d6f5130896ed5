"""The layout a run launches, chosen by the cost model from compile reports (`sao.aot.layout_choice`,
`experiments/choose_layout.py`)."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from sao.aot import layout_choice, report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _report(tmp_path, name: str, seconds: dict[int, float | None]) -> str:
  """A report of one program per bucket; None: the program does not fit there."""
  settings = {"topology": "v5p:4x4x8", "chips": 128, "config": name, "config_overrides": name,
              "code_version": "abc1234", "mesh": {"fsdp": 8}, "num_layers": 40}
  rows = []
  for bucket, s in seconds.items():
    row = report.ReportRow("actor_step_dis", bucket, 64, 1, "actor", True, s is not None, 1, 1, 1, 3, 1 << 36,
                           1e15, 1e15, 1e15, 1.0, 0.1, 1.0, instruction_seconds=s, instruction_mfu=0.3 if s else None)
    row.status = "compiled" if s is not None else "does_not_fit"
    rows.append(dict(dataclasses.asdict(row), **settings))
  path = tmp_path / f"{name}.json"
  path.write_text(json.dumps(rows))
  return str(path)


@pytest.fixture
def layouts(tmp_path):
  wide = _report(tmp_path, "full", {32768: 40.0, 65536: 90.0, 131072: 160.0})
  expert = _report(tmp_path, "full_64k", {32768: 7.0, 65536: 18.0})
  return [layout_choice.Layout.load(wide), layout_choice.Layout.load(expert)]


def test_the_fastest_layout_that_holds_the_longest_episode_is_chosen(layouts):
  wide, expert = layouts
  best = layout_choice.fastest_per_bucket(layouts)
  assert best[32768] == (expert, 7.0) and best[65536] == (expert, 18.0) and best[131072] == (wide, 160.0)
  assert layout_choice.choose(layouts, 40000) == (expert, 65536, 18.0)  # a 40k episode pads to the 65k bucket
  assert layout_choice.choose(layouts, 65536) == (expert, 65536, 18.0)
  assert layout_choice.choose(layouts, 65537) == (wide, 131072, 160.0)  # only `full` holds it


def test_a_layout_with_a_bucket_that_does_not_fit_below_the_longest_is_not_chosen(tmp_path):
  gap = layout_choice.Layout.load(_report(tmp_path, "gap", {32768: 5.0, 65536: None, 131072: 100.0}))
  wide = layout_choice.Layout.load(_report(tmp_path, "wide", {32768: 40.0, 65536: 90.0, 131072: 160.0}))
  assert layout_choice.choose([gap, wide], 131072)[0] is wide  # gap cannot run the 65k batches on the way
  assert layout_choice.choose([gap, wide], 30000)[0] is gap
  with pytest.raises(ValueError, match=r"no layout runs episodes of 200000 tokens: gap .*no bucket holds"):
    layout_choice.choose([gap, wide], 200000)


def test_the_command_prints_the_choice_and_fails_when_none_qualifies(tmp_path):
  wide = _report(tmp_path, "full", {32768: 40.0, 131072: 160.0})
  expert = _report(tmp_path, "full_64k", {32768: 7.0, 65536: 18.0})
  command = [sys.executable, os.path.join(ROOT, "experiments", "choose_layout.py"), f"--report={wide}",
             f"--report={expert}"]
  done = subprocess.run(command + ["--max_tokens=50000"], capture_output=True, text=True, timeout=120,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert done.returncode == 0, done.stderr
  assert "T=32768: fastest full_64k (full_64k) on v5p:4x4x8, 7.00 s" in done.stdout
  assert "episodes ≤ 50000 tokens: launch full_64k (full_64k) on v5p:4x4x8 (18.00 s per update at T=65536)" in done.stdout
  failed = subprocess.run(command + ["--max_tokens=300000"], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert failed.returncode == 1 and "no layout runs episodes of 300000 tokens" in failed.stderr
