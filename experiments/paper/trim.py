r"""Trims a sweep's run directories to what the sweep tables read and writes them into the repository
(`sao.analysis.archive`): `experiments/paper/runs/<sweep>/<run>/{metrics.jsonl, run.json, evaluation/vN.json}`.

    python experiments/paper/trim.py --sweep=toy_algorithms --workdir=/tmp/toy_algorithms [--evaluate] \
        [--only=sao-seed0,...]

Every run of the sweep whose directory holds a metric log is written — finished runs as `complete`, runs cut short
or failed as `incomplete` (with the last error line of their launch log) — so that every started run is reported;
runs never started are listed and skipped. With `--evaluate`, each finished run's final policy is first re-measured
on every split (`experiments/evaluate.py --workdir=<run dir>`, results in `<run dir>/evaluation/vN.json`); without
it, a finished run lacking that file gets the command that makes one. Each run keeps the code version its
launcher stamped (`launch.sweep`); `experiments/reproduce.py --sweep=<name>` then prints the tables.
"""
from __future__ import annotations

import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.paper import sweeps  # noqa: E402


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import: tests import every command in one process, and
  commands share flag names, e.g. `--config`, `--out`, `--batch`)."""
  global _SWEEP, _WORKDIR, _OUT, _ONLY, _EVALUATE, _SAMPLES  # pylint: disable=global-statement
  _SWEEP = flags.DEFINE_string("sweep", None, "Sweep name (launch/sweeps/<name>.py) or a sweep file path.")
  _WORKDIR = flags.DEFINE_string("workdir", None, "The sweep's workdir (launch.local --workdir): <workdir>/<run>.")
  _OUT = flags.DEFINE_string("out", "", "Where the trimmed runs go (default experiments/paper/runs/<sweep name>).")
  _ONLY = flags.DEFINE_list("only", [], "Trim only these run names.")
  _EVALUATE = flags.DEFINE_bool("evaluate", False, "First re-measure every finished run's final policy that has no "
                                "evaluation/vN.json yet (experiments/evaluate.py, one run at a time).")
  _SAMPLES = flags.DEFINE_integer("samples", 12, "With --evaluate: episodes per task (evaluate.py --samples).")


def main(argv):
  del argv
  out = _OUT.value or os.path.join(sweeps.RUNS_ROOT, sweeps.sweep_name(_SWEEP.value))
  evaluate = (lambda run, run_dir: run.evaluate_command(run_dir) + [f"--samples={_SAMPLES.value}"]) if (
      _EVALUATE.value) else None
  written = sweeps.trim_sweep(_SWEEP.value, _WORKDIR.value, out, _ONLY.value, evaluate)
  print(f"[trim] {len(written)} run(s) written under {out}")


if __name__ == "__main__":
  define_flags()
  flags.mark_flags_as_required(["sweep", "workdir"])
  app.run(main)
