"""Issue 21's sweep pipeline behind `experiments/paper/trim.py` and `experiments/reproduce.py --sweep` (no flags, so
tests import it): trim a sweep's run directories into `experiments/paper/runs/<sweep>/`, and print the tables (and
write the figures) of the committed runs.
"""
from __future__ import annotations

import os
import shlex
import subprocess
from typing import Callable

from launch import local
from launch import sweep as sweep_lib
from sao.analysis import archive, arm_figures, sweep_runs, sweep_tables
from sao.analysis import runs as runs_lib

RUNS_ROOT = os.path.join(sweep_lib.REPO_ROOT, "experiments", "paper", "runs")


def sweep_name(sweep: str) -> str:
  return os.path.splitext(os.path.basename(sweep))[0]


def _evaluate(run: sweep_lib.Run, run_dir: str, command: list[str]) -> None:
  """Runs `command` (the re-measurement of the run's final policy), its output appended to `<run dir>/evaluate.log`."""
  log_path = os.path.join(run_dir, "evaluate.log")
  print(f"[trim] {run.name}: re-measuring the final policy (log {log_path})", flush=True)
  with open(log_path, "ab") as log:
    code = subprocess.run(command, cwd=sweep_lib.REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, check=False).returncode
  if code != 0:
    print(f"[trim] {run.name}: re-measurement failed (exit code {code}); tail of {log_path}:\n"
          f"{local.log_tail(log_path, 1500)}", flush=True)


def trim_sweep(sweep: str, workdir: str, out: str, only: list[str] | None = None,
               evaluate_command: Callable[[sweep_lib.Run, str], list[str]] | None = None) -> list[dict]:
  """Trims every started run of `sweep` under `workdir` into `out`; returns their `run.json` contents. With
  `evaluate_command(run, run_dir)` (e.g. `Run.evaluate_command`), a finished run whose final policy has no
  re-measurement yet is re-measured first."""
  run_list = sweep_lib.load_sweep(sweep_lib.sweep_path(sweep))
  if only:
    unknown = sorted(set(only) - {r.name for r in run_list})
    if unknown:
      raise ValueError(f"--only: unknown run name(s) {unknown}")
    run_list = [r for r in run_list if r.name in only]
  written = []
  for run in run_list:
    run_dir = os.path.join(os.path.abspath(workdir), run.name)
    if not os.path.isfile(os.path.join(run_dir, runs_lib.METRICS_FILE)):
      print(f"[trim] {run.name}: not started (no {runs_lib.METRICS_FILE} in {run_dir})")
      continue
    version = sweep_lib.read_code_version(run_dir)
    if version is None:
      print(f"[trim] {run.name}: WARNING no {sweep_lib.VERSION_FILE} (not launched by launch.local); version unknown")
    info = {"name": run.name, "arm": run.arm_name, "seed": run.overrides.get("seed", 0), "config": run.config,
            "overrides": dict(run.overrides), "code_version": version or "unknown"}
    finished = os.path.isfile(os.path.join(run_dir, local.DONE))
    if evaluate_command is not None and finished and runs_lib.final_evaluation(run_dir) is None:
      _evaluate(run, run_dir, evaluate_command(run, run_dir))
    meta = archive.write_trimmed_run(run_dir, os.path.join(out, run.name), info, finished=finished,
                                     expected_last_step=sweep_lib.expected_last_step(run),
                                     log_path=os.path.join(run_dir, local.LOG))
    evaluated = runs_lib.final_evaluation(run_dir)
    print(f"[trim] {run.name}: {meta['status']} (step {meta['last_step']} of {meta['expected_last_step']}), "
          f"re-measured: {evaluated[0] if evaluated else 'no'}" + (f"; note: {meta['note']}" if meta["note"] else ""))
    if meta["status"] == archive.COMPLETE and evaluated is None:
      print(f"[trim]   re-measure it with: {shlex.join(run.evaluate_command(run_dir, python='python'))}")
    written.append(meta)
  return written


def sweep_report(sweep: str, runs_dir: str, by_version: bool = False, threshold: float | None = None,
                 window: int = 20) -> tuple[str, dict[str, list]]:
  """The sweep's markdown tables and its runs per code version (refusing mixed versions unless `by_version`)."""
  name = sweep_name(sweep)
  analysis = sweep_lib.load_analysis(sweep_lib.sweep_path(sweep))
  runs = sweep_runs.load_sweep_runs(runs_dir or os.path.join(RUNS_ROOT, name))
  if not by_version:
    sweep_runs.check_one_version(runs)
  groups = sweep_runs.by_version(runs)
  committed = {r.name for r in runs}
  not_started = [r.name for r in sweep_lib.load_sweep(sweep_lib.sweep_path(sweep)) if r.name not in committed]
  text = "\n".join(sweep_tables.sweep_tables(name, group, analysis, version, threshold, window, not_started)
                   for version, group in groups.items())
  if len(groups) > 1:
    text = (f"# {len(groups)} code versions: each has its own tables (runs of different versions are not "
            "compared)\n\n" + text)
  return text, groups



def write_outputs(sweep: str, text: str, groups: dict[str, list], out_dir: str) -> list[str]:
  """`<out_dir>/<sweep>.md` and, per code version, `<sweep>[_v<i>]_arms.png` and — when the sweep's `ANALYSIS` names
  a `reference` arm — `<sweep>[_v<i>]_factors.png` (`arm_figures.plot_factors`: each other arm against it); returns
  the paths."""
  name = sweep_name(sweep)
  analysis = sweep_lib.load_analysis(sweep_lib.sweep_path(sweep))
  reference = analysis.get("reference")
  os.makedirs(out_dir, exist_ok=True)
  paths = [os.path.join(out_dir, f"{name}.md")]
  with open(paths[0], "w", encoding="utf-8") as f:
    f.write(text)
  for i, (version, group) in enumerate(groups.items()):
    suffix = "" if len(groups) == 1 else f"_v{i}"
    paths.append(arm_figures.plot_arms(group, os.path.join(out_dir, f"{name}{suffix}_arms.png"),
                                       f"{name} — code version {version[:12]}"))
    if reference is None:
      continue
    arms = arm_figures.complete_by_arm(group)
    if reference not in arms or len(arms) < 2:
      print(f"[reproduce] no {name}{suffix}_factors.png: it needs complete runs of the reference arm {reference!r} "
            f"and of another arm (arms with complete runs: {sorted(arms)})")
      continue
    paths.append(arm_figures.plot_factors(group, reference, os.path.join(out_dir, f"{name}{suffix}_factors.png"),
                                          f"{name}: each arm against {reference} — code version {version[:12]}",
                                          analysis.get("factors")))
  return paths
