r"""Prints the write-up's tables (markdown) for a set of runs, side by side with its reported numbers, and writes
the figures (`sao.analysis.figures.write_all`: Figures 1–5 and 7 as far as the runs support them).

    python experiments/reproduce.py --runs=sao=/tmp/sao_toy,gspo=/tmp/gspo_toy,sao_initial=/tmp/sao_initial_toy \
        --out_dir=/tmp/paper [--table=1,2] [--threshold=60] [--ev_steps=40,100] [--turns_steps=120,139]

Run names select the reported column: `sao`, `gspo` (SWE-bench Verified, sampling cost), `sao_initial` (with `sao`:
the recipe table), `sao_multilingual`, `sao_mixed_harness` (SWE-bench Multilingual). Other names get tables without
reported numbers. Toy runs are far shorter than the paper's, so pass step ranges and a threshold that fit them.

A sweep's committed runs (issue 21: `toy_algorithms`, `toy_matched_concurrency`, `toy_ablations`):

    python experiments/reproduce.py --sweep=toy_algorithms [--out_dir=/tmp/tables] [--by_version] [--threshold=60]

reads `experiments/paper/runs/<sweep>/<run>/` (`--runs_dir` elsewhere; written by `experiments/paper/trim.py`), prints
the tables the sweep file's `ANALYSIS` names (`sao.analysis.sweep_tables`) and, with `--out_dir`, writes
`<sweep>.md`, `<sweep>_arms.png` (mean curve and 95 % band per arm) and, for a sweep whose `ANALYSIS` names a
`reference` arm, `<sweep>_factors.png` (one panel per other arm: its validation curve against the reference's).
Runs of different code versions are refused unless `--by_version`, which prints one set of tables (and figures) per
version.
"""
from __future__ import annotations

import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # `experiments.paper` imports

from experiments.paper import reported  # noqa: E402
from experiments.paper import sweeps  # noqa: E402
from sao.analysis import figures, tables  # noqa: E402
from sao.analysis import runs as runs_lib  # noqa: E402


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import: tests import every command in one process, and
  commands share flag names, e.g. `--config`, `--out`, `--batch`)."""
  global _RUNS, _SWEEP, _RUNS_DIR, _BY_VERSION, _OUT_DIR, _TABLE, _THRESHOLD  # pylint: disable=global-statement
  global _WINDOW, _EV_STEPS, _TURNS_STEPS  # pylint: disable=global-statement
  _RUNS = flags.DEFINE_list("runs", None, "name=workdir pairs.")
  _SWEEP = flags.DEFINE_string("sweep", "", "A sweep's name (launch/sweeps/<name>.py): its committed runs' tables.")
  _RUNS_DIR = flags.DEFINE_string("runs_dir", "", "The sweep's trimmed runs (default experiments/paper/runs/<sweep>).")
  _BY_VERSION = flags.DEFINE_bool("by_version", False, "With --sweep: one set of tables per code version instead of "
                                  "refusing runs of different versions.")
  _OUT_DIR = flags.DEFINE_string("out_dir", "", "Where to write tables.md and the figures ('' = print only).")
  _TABLE = flags.DEFINE_list("table", [], "Table numbers to print (1 validation, 2 sampling cost, 3 behaviour, "
                             "4 applications + recipe, 5 critic); empty = all.")
  _THRESHOLD = flags.DEFINE_float("threshold", None, "Validation threshold in % (default: the write-up's 68).")
  _WINDOW = flags.DEFINE_integer("window", 20, "First/last steps averaged in the behaviour table.")
  _EV_STEPS = flags.DEFINE_list("ev_steps", [], "lo,hi RL steps for the critic EV mean (default 40,100).")
  _TURNS_STEPS = flags.DEFINE_list("turns_steps", [], "lo,hi RL steps for the mean turns (default 120,139).")


def parse_runs(items: list[str]) -> list[tuple[str, str]]:
  """["sao=/a", "gspo=/b"] -> [("sao", "/a"), ("gspo", "/b")]; errors name the bad item."""
  pairs = []
  for item in items:
    name, sep, workdir = item.partition("=")
    if not sep or not name or not workdir:
      raise ValueError(f"--runs: {item!r} is not name=workdir")
    pairs.append((name, workdir))
  return pairs


def _range(values: list[str], flag: str) -> tuple[int, int] | None:
  if not values:
    return None
  if len(values) != 2:
    raise ValueError(f"--{flag}: expected lo,hi, got {values}")
  return int(values[0]), int(values[1])


def main_sweep() -> None:
  text, groups = sweeps.sweep_report(_SWEEP.value, _RUNS_DIR.value, _BY_VERSION.value, _THRESHOLD.value,
                                     _WINDOW.value)
  print(text)
  if _OUT_DIR.value:
    for path in sweeps.write_outputs(_SWEEP.value, text, groups, _OUT_DIR.value):
      print(f"[reproduce] {path}")


def main(argv):
  del argv
  if bool(_SWEEP.value) == bool(_RUNS.value):
    raise app.UsageError("give exactly one of --runs (name=workdir pairs) and --sweep (a sweep's committed runs)")
  if _SWEEP.value:
    main_sweep()
    return
  runs = [runs_lib.load_run(name, workdir) for name, workdir in parse_runs(_RUNS.value)]
  text = tables.paper_tables(runs, reported.ALL, threshold=_THRESHOLD.value, window=_WINDOW.value,
                             ev_steps=_range(_EV_STEPS.value, "ev_steps"),
                             turns_steps=_range(_TURNS_STEPS.value, "turns_steps"),
                             tables=[int(t) for t in _TABLE.value] or None)
  print(text)
  if _OUT_DIR.value:
    os.makedirs(_OUT_DIR.value, exist_ok=True)
    with open(os.path.join(_OUT_DIR.value, "tables.md"), "w", encoding="utf-8") as f:
      f.write(text)
    for png in figures.write_all(runs, reported.ALL, _OUT_DIR.value):
      print(f"[reproduce] {png}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
