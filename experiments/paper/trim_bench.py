r"""Trims `experiments/bench/bench_pipeline.py --out` measurements to what the fleet simulator's validation reads
(`sao.simulation.validation.trimmed`) and writes them into the repository, same file names:

    python experiments/paper/trim_bench.py --out=experiments/paper/fleet_validation /tmp/fleet/b_r1_c16.json ...

`python experiments/simulate_fleet.py --validate=experiments/paper/fleet_validation` then compares the simulator with
them from the repository alone.
"""
from __future__ import annotations

import json
import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from sao.simulation import validation  # noqa: E402


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import: tests import every command in one process, and
  commands share flag names, e.g. `--config`, `--out`, `--batch`)."""
  global _OUT  # pylint: disable=global-statement
  _OUT = flags.DEFINE_string("out", None, "Folder the trimmed measurements go to.", required=True)


def trim_file(source: str, out_dir: str) -> str:
  """Writes `source`'s measurements (a JSON list, one per bench mode) trimmed to `out_dir`/<same name>; returns the
  path. ValueError naming the file when it is not such a list."""
  with open(source, encoding="utf-8") as f:
    measurements = json.load(f)
  if not isinstance(measurements, list) or not all(isinstance(m, dict) and "mode" in m for m in measurements):
    raise ValueError(f"{source}: not a bench_pipeline.py --out file (a JSON list of per-mode measurements)")
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, os.path.basename(source))
  with open(path, "w", encoding="utf-8") as f:
    json.dump([validation.trimmed(m) for m in measurements], f, separators=(",", ":"))
    f.write("\n")
  return path


def main(argv):
  if len(argv) < 2:
    raise app.UsageError("name the bench_pipeline.py --out files to trim")
  for source in argv[1:]:
    print(f"{source} ({os.path.getsize(source):,} bytes) -> {trim_file(source, _OUT.value)} "
          f"({os.path.getsize(os.path.join(_OUT.value, os.path.basename(source))):,} bytes)")


if __name__ == "__main__":
  define_flags()
  app.run(main)
