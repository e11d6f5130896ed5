"""`experiments/bench/bench_publish.py` on a tiny policy: the script runs end to end against a real local engine
process, prints every phase and the copy baseline, and the engine reaches the last published version (no timing
asserted)."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PHASES = ("export_ms", "load_ms", "swap_ms", "http_ms", "total_ms", "copy_write_ms", "copy_read_ms", "copy_ms",
          "ratio", "export_cpu_ms", "load_cpu_ms", "copy_cpu_ms", "cpu_ratio", "publish_bytes_per_s",
          "copy_bytes_per_s", "publish_ns_per_byte", "copy_ns_per_byte")


def test_bench_publishes_two_versions_of_a_tiny_policy(tmp_path):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
  out = subprocess.run([sys.executable, str(ROOT / "experiments" / "bench" / "bench_publish.py"), "--model=tiny",
                        "--versions=2", f"--workdir={tmp_path}"], env=env, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-4000:]
  lines = out.stdout.splitlines()
  assert [l.split(":")[0] for l in lines if l.startswith("version ")] == ["version 1", "version 2"]
  summary = json.loads(next(l for l in lines if l.startswith("SUMMARY "))[len("SUMMARY "):])
  assert summary["model"] == "tiny" and summary["versions"] == 2
  assert summary["engine_version"] == "2"  # the engine serves the last version published
  assert summary["bytes"] > 0 and all(summary[k] >= 0 for k in PHASES), summary
  # Each version is an HF directory the engine loaded; the exports behind the last one are removed as it goes.
  assert sorted(os.listdir(tmp_path / "policy")) == ["v0", "v2"]
  assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(tmp_path / "policy" / "v2"))
