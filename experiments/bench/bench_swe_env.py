r"""SWE environment throughput: episodes/s of the scripted expert with N concurrent bubblewrap sandboxes.

    python experiments/bench/bench_swe_env.py [--concurrency=8,32] [--episodes=64] [--split=train]

Each episode is what a rollout worker pays per SWE task apart from the model: a fresh clone of the repository,
the expert's six tool calls (reproduce, grep, view, str_replace, the test suite, submit), and SWE-bench grading in
a second fresh sandbox (apply the diff and the test patch, run FAIL_TO_PASS and PASS_TO_PASS). Reported per
concurrency: episodes/s, the expert's success rate, and the mean / p90 episode latency. The generated repositories
are materialized (cached) before timing starts.
"""
from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import: tests import every command in one process, and
  commands share flag names, e.g. `--config`, `--out`, `--batch`)."""
  global _CONCURRENCY, _EPISODES, _SPLIT, _NUM_REPOS  # pylint: disable=global-statement
  _CONCURRENCY = flags.DEFINE_list("concurrency", ["8", "32"], "Concurrent sandboxes, one measurement each.")
  _EPISODES = flags.DEFINE_integer("episodes", 64, "Episodes per measurement (tasks cycle through the split).")
  _SPLIT = flags.DEFINE_string("split", "train", "Split whose tasks are played.")
  _NUM_REPOS = flags.DEFINE_integer("num_repos", 240, "Generated repositories in the dataset.")


def main(argv):
  del argv
  from sao.rollout.envs.swe import SweEnv  # pylint: disable=g-import-not-at-top
  from sao.rollout.envs.swe.pool import EpisodePool
  from sao.transport.trajectory import Status

  root = tempfile.mkdtemp(prefix="sao_bench_swe_")
  make = lambda: SweEnv(num_repos=_NUM_REPOS.value, sandbox_root=root)
  tasks = make().tasks(_SPLIT.value, _EPISODES.value, seed=0)
  for task in tasks:  # materialize outside the timed region
    SweEnv.snapshot_source(task)
  print(f"{os.cpu_count()} CPUs; {len(tasks)} episodes per measurement from {_SPLIT.value!r}")
  print("| concurrent sandboxes | episodes/s | expert success | mean latency (s) | p90 latency (s) |")
  print("|---|---|---|---|---|")
  for concurrency in (int(c) for c in _CONCURRENCY.value):
    pool = EpisodePool(concurrency, make)
    start = time.monotonic()
    results = asyncio.run(pool.map(tasks))
    wall = time.monotonic() - start
    latencies = sorted(r.duration_s for r in results)
    solved = sum(r.status == Status.OK and r.reward == 1.0 for r in results)
    p90 = latencies[min(len(latencies) - 1, int(0.9 * len(latencies)))]
    print(f"| {concurrency} | {len(results) / wall:.2f} | {solved}/{len(results)} | "
          f"{statistics.fmean(latencies):.1f} | {p90:.1f} |", flush=True)
  os.rmdir(root)  # every episode cleaned up after itself: the directory is empty


if __name__ == "__main__":
  define_flags()
  app.run(main)
