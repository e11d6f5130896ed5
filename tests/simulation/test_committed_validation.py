"""The fleet simulator's validation re-runs from the repository alone: `simulate_fleet.py --validate` on the committed
bench measurements (`experiments/paper/fleet_validation/`, README there) prints every comparison, and the trimmed
files are what `experiments/paper/trim_bench.py` writes."""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from experiments.paper import trim_bench
from sao.simulation import validation

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "experiments" / "paper" / "fleet_validation"
# The committed measurements' own numbers (traj/s, busy, staleness, steady staleness): a file that changes shows here.
MEASURED = {"b_r1_c16": (3.731, 0.111, 0.312, 0.106), "b_r1_c64": (4.456, 0.184, 0.417, 0.306)}


def test_validate_runs_on_the_committed_measurements():
  out = subprocess.run([sys.executable, str(ROOT / "experiments" / "simulate_fleet.py"), f"--validate={COMMITTED}",
                        "--validation_seeds=4"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
  row = r"^\| (b_r1_c\d+): \d+ loops \(load [^)]*\) \| (\w+) \| ([\d.]+) \| ([\d.]+) \| [\d.]+% \| (yes|NO) \|$"
  rows = re.findall(row, out.stdout, re.M)
  assert len(rows) == 8, out.stdout + out.stderr
  for name, expected in MEASURED.items():
    measured = {metric: float(value) for row, metric, _, value, _ in rows if row == name}
    assert list(measured) == list(validation.METRICS) and tuple(measured.values()) == expected
  # Throughput and the trainer's busy fraction are well within the 20 % tolerance (README: 5.7–6.8 % at 20 seeds).
  assert all(within == "yes" for _, metric, _, _, within in rows if metric in ("traj_per_s", "busy"))
  verdict = "yes" if all(within == "yes" for *_, within in rows) else "NO"
  assert out.stdout.rstrip().endswith(f"all within 20%: {verdict}")
  assert out.returncode == (0 if verdict == "yes" else 1)


def test_committed_files_are_trimmed_measurements(tmp_path):
  for path in sorted(COMMITTED.glob("*.json")):
    assert trim_bench.trim_file(str(path), str(tmp_path)) == str(tmp_path / path.name)  # trimming is idempotent
    assert json.loads((tmp_path / path.name).read_text()) == json.loads(path.read_text())
    (measured,) = json.loads(path.read_text())
    assert measured["mode"] == "async" and set(measured) <= set(validation.READ_KEYS)
  assert sorted(p.stem for p in COMMITTED.glob("*.json")) == sorted(MEASURED)


def test_trim_refuses_a_file_that_is_not_a_measurement(tmp_path):
  bad = tmp_path / "fleet.json"
  bad.write_text(json.dumps({"rows": []}))
  with pytest.raises(ValueError, match="fleet.json: not a bench_pipeline.py --out file"):
    trim_bench.trim_file(str(bad), str(tmp_path / "out"))
