r"""A fleet you cannot afford, simulated: SAO and GSPO at thousands of agent loops (docs/fleet_simulation.md).

    python experiments/simulate_fleet.py --config=experiments/configs/simulation/fleet_sim.py:full \
        --out_dir=/tmp/fleet_sim

runs `sao.simulation` (the project's dispenser, buffer, flow control and admission under a simulated clock) for every
(algorithm, flow control, loops) of the config, prints one row each (trajectories trained per hour next to what linear
concurrency scaling assumes, trainer busy fraction, staleness mean / p50 / p99, work discarded as stale, the loops'
utilisation, and the simulated hours to the write-up's trajectories-to-best), and writes `fleet.json` and
`fleet.png` to `--out_dir`.

    python experiments/simulate_fleet.py --validate=/tmp/bench_c16.json,/tmp/bench_c64.json
    python experiments/simulate_fleet.py --validate=experiments/paper/fleet_validation   # the committed ones

instead compares the simulator with `experiments/bench/bench_pipeline.py --out=...` measurements of the real pipeline
(`sao.simulation.validation`, the engine's stalls derived from each measurement's trajectory records;
`--novalidation_stalls`: without them; the engine's slowdown while the trainer computes, measured the same way;
`--novalidation_contention`: without it) and exits 1 if any metric is off by more than `--tolerance`. A folder in
`--validate` stands for every `*.json` in it.
"""
from __future__ import annotations

import glob
import json
import logging
import os
import sys
import time

from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # `experiments.configs` imports

from sao.simulation import distributions, figures, validation  # pylint: disable=g-import-not-at-top
from sao.simulation.fleet import simulate  # pylint: disable=g-import-not-at-top
from sao.simulation.model import EpisodeModel, FleetConfig  # pylint: disable=g-import-not-at-top


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import: tests import every command in one process, and
  commands share flag names, e.g. `--config`, `--out`, `--batch`)."""
  global _CONFIG, _OUT_DIR, _VALIDATE, _TOLERANCE, _SEEDS, _STALLS, _CONTENTION  # pylint: disable=global-statement
  _CONFIG = config_flags.DEFINE_config_file("config", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                   "configs", "simulation", "fleet_sim.py:full"),
                                            "Fleet simulation config (get_config(arg)).", lock_config=True)
  _OUT_DIR = flags.DEFINE_string("out_dir", "", "Write fleet.json and fleet.png here ('' = print only).")
  _VALIDATE = flags.DEFINE_list("validate", [], "bench_pipeline.py --out JSON files (or folders of them): compare "
                                 "instead of simulating.")
  _TOLERANCE = flags.DEFINE_float("tolerance", 0.2, "Largest relative error --validate accepts.")
  _SEEDS = flags.DEFINE_integer("validation_seeds", 20, "Simulated runs averaged per bench measurement.")
  _STALLS = flags.DEFINE_boolean("validation_stalls", True, "--validate: give the simulated twin the engine stalls "
                                 "derived from the measurement (sao.simulation.bench_stalls).")
  _CONTENTION = flags.DEFINE_boolean("validation_contention", True, "--validate: let the simulated twin's engine "
                                     "slow down while the trainer computes, by the factor measured "
                                     "(sao.simulation.bench_contention).")


def fleet_config(config, algorithm: str, loops: int, flow_control: str) -> FleetConfig:
  """One cell of the grid as a `FleetConfig`."""
  if algorithm not in ("sao", "gspo"):
    raise ValueError(f"algorithm {algorithm!r}: expected 'sao' or 'gspo'")
  a = config[algorithm]
  shipped = 2 * a.batch_size  # `common.finalize`: max_outstanding = 2 × batch
  if flow_control == "shipped":
    max_outstanding = shipped
  elif flow_control == "scaled":
    max_outstanding = max(shipped, loops)
  elif flow_control.endswith("x") and flow_control[:-1].isdigit() and int(flow_control[:-1]) > 0:
    max_outstanding = int(flow_control[:-1]) * a.batch_size  # e.g. "4x": 4 × batch
  else:
    raise ValueError(f"flow_control {flow_control!r}: expected 'shipped', 'scaled' or '<k>x' (k × batch)")
  e = config.episode
  episode = EpisodeModel(setup_s=distributions.parse(e.setup_s), turns=distributions.parse(e.turns),
                         gen_s=distributions.parse(e.gen_s), tool_s=distributions.parse(e.tool_s))
  return FleetConfig(
      loops=loops, episode=episode, step_s=distributions.Distribution("constant", a.step_s),
      group_size=a.group_size, batch_size=a.batch_size, engine_slots=config.engine_slots, publish_s=config.publish_s,
      max_staleness=config.max_staleness, buffer_capacity=a.buffer_capacity,
      max_outstanding=max_outstanding,
      lease_ttl_s=config.lease_ttl_s, backpressure_retry_s=config.backpressure_retry_s,
      no_work_retry_s=config.no_work_retry_s, num_tasks=config.num_tasks, seed=config.seed,
      target_trajectories=a.target_trajectories, max_hours=config.max_hours)


def _hours(h):
  return "-" if h is None else f"{h:.1f}"


def run_grid(config) -> list[dict]:
  rows = []
  print(f"{'alg':<5} {'flow':<8} {'loops':>5} {'traj/h':>7} {'linear/h':>8} {'busy':>5} {'stale':>5} {'p50':>3} "
        f"{'p99':>3} {'discard':>7} {'util':>5} {'blocked':>7} {'h to N':>7} {'N':>6} {'sim s':>5}", flush=True)
  for algorithm in config.algorithms:
    for flow_control in config.flow_control:
      for loops in config.loops:
        start = time.monotonic()
        report = simulate(fleet_config(config, algorithm, loops, flow_control))
        row = {"algorithm": algorithm, "flow_control": flow_control, **report.summary()}
        rows.append(row)
        print(f"{algorithm:<5} {flow_control:<8} {loops:>5} {row['trained_per_hour']:7.0f} "
              f"{row['linear_per_hour']:8.0f} {row['busy']:5.2f} {row['staleness_mean']:5.2f} "
              f"{row['staleness_p50']:3d} {row['staleness_p99']:3d} {row['discarded_fraction']:7.1%} "
              f"{row['loop_utilisation']:5.2f} {row['loop_blocked']:7.2f} {_hours(row['time_to_target_h']):>7} "
              f"{config[algorithm].target_trajectories:6d} {time.monotonic() - start:5.0f}", flush=True)
  return rows


def measurement_files(paths) -> list[str]:
  """`paths` with each folder replaced by the `*.json` files in it, in name order."""
  files = []
  for path in paths:
    files += sorted(glob.glob(os.path.join(path, "*.json"))) if os.path.isdir(path) else [path]
  return files


def run_validation(paths, tolerance: float, seeds: int, stalls: bool = True, contention: bool = True) -> bool:
  table, ok = [], True
  for path in measurement_files(paths):
    with open(path, encoding="utf-8") as f:
      measurements = json.load(f)
    for measured in measurements:
      if measured.get("mode") != "async":
        continue
      observed = validation.measured_metrics(measured)
      comparisons = validation.compare(validation.predict(measured, range(seeds), stalls, contention), observed,
                                       [m for m in validation.METRICS if m in observed])
      load = f"load {measured['loadavg_before'][0]:.0f}→{measured['loadavg_after'][0]:.0f}"
      name = os.path.splitext(os.path.basename(path))[0]
      table.append((f"{name}: {measured['concurrency']} loops ({load})", comparisons))
      ok &= all(c.within(tolerance) for c in comparisons)
  if not table:
    raise app.UsageError(f"--validate: no async bench measurement in {paths}")
  print(validation.format_table(table, tolerance))
  return ok


def main(argv):
  del argv
  # Leases of samples rejected as stale lapse and are re-leased by design; one INFO line each would drown the table.
  logging.getLogger("sao.transport.dispenser").setLevel(logging.WARNING)
  if _VALIDATE.value:
    ok = run_validation(_VALIDATE.value, _TOLERANCE.value, _SEEDS.value, _STALLS.value,
                        _CONTENTION.value)
    print(f"\nall within {_TOLERANCE.value:.0%}: {'yes' if ok else 'NO'}")
    sys.exit(0 if ok else 1)
  config = _CONFIG.value
  rows = run_grid(config)
  if _OUT_DIR.value:
    os.makedirs(_OUT_DIR.value, exist_ok=True)
    with open(os.path.join(_OUT_DIR.value, "fleet.json"), "w", encoding="utf-8") as f:
      json.dump({"config": config.to_dict(), "rows": rows}, f, indent=1)
    print(f"wrote {figures.plot_fleet(rows, os.path.join(_OUT_DIR.value, 'fleet.png'))}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
