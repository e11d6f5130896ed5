"""`experiments/bench/cost_model_check.py` prices every program of one SAO update from its compiled HLO and times it:
at tiny sizes on CPU each row has a positive prediction, a measurement and their ratio, and the update row sums
the programs by their calls (so the check is ready for the next GPU run)."""
import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tiny_update_is_priced_and_timed(tmp_path):
  out = tmp_path / "cost.jsonl"
  result = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "bench", "cost_model_check.py"),
                           "--hidden=64", "--layers=1", "--seq_len=64", "--batch=2", "--vocab=256", "--matmul=256",
                           "--repeats=1", f"--out={out}"], capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  programs = {r["program"]: r for r in rows}
  assert {"critic_step", "critic_values", "actor_step[dis]", "update"} <= set(programs), sorted(programs)
  for name in ("critic_step", "critic_values", "actor_step[dis]"):
    row = programs[name]
    assert row["matmul_flops"] > 0 and row["predicted_s"] >= row["roofline_s"] * (1 - 1e-9) > 0 and row["measured_s"] > 0
    assert math.isfinite(row["factor"]) and row["factor"] > 0 and not row["unknown_trip_counts"]
  update = programs["update"]
  steps = [r for r in rows if r["program"] != "update"]
  assert math.isclose(update["predicted_s"], sum(r["predicted_s"] * r["calls"] for r in steps))
  assert update["factor"] == update["measured_s"] / update["predicted_s"]
  assert programs["critic_step"]["calls"] == 2  # K = 2 critic epochs
  assert "measured / predicted" in result.stdout
