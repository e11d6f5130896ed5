"""`experiments/bench/bench_gae.py` runs end to end at a tiny size and prints a row per implementation."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_benchmark_prints_every_row():
  result = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "bench", "bench_gae.py"), "--sizes=4x64",
                           "--repeats=1"], capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  rows = [line.split()[1:-9] for line in result.stdout.splitlines() if line.strip().startswith("4x64")]
  names = [" ".join(words) for words in rows]
  assert names[0] == "numpy loop over t" and names[-1] == "copy (memory bound)"
  assert "jax gae+whiten fused (native)" in names and "jax gae+whiten fused chunked" in names
  assert {"jax gae+whiten native", "jax gae+whiten chunked", "gae alone (native)"} <= set(names)
  assert "malloc keep" in result.stdout
