"""A CPU job's processes share the persistent compilation cache (`sao.engines.compilation_cache.
share_cpu_keys_across_processes`, called by `sao.train.distributed.initialize`): JAX's own device hash differs
between the two processes of a job, the job's is the same, and a second job on the same directory has every
process served from the cache, with the same results."""
from __future__ import annotations

import json

import numpy as np

from tests import multihost

WORKER = "tests/train/multihost_cache_keys_worker.py"


def _job(cache_dir: str) -> list[dict]:
  results = multihost.run_processes(WORKER, num_processes=2, devices_per_process=2, timeout_s=180,
                                    env=multihost.compilation_cache_env(cache_dir))
  rows = []
  for r in results:
    rows += [json.loads(line) for line in r.output.splitlines() if line.startswith("{")]
  return sorted(rows, key=lambda row: row["process"])


def test_every_process_reads_the_executables_process_0_wrote(tmp_path):
  first = _job(str(tmp_path))
  n = 4 * 4
  expected = (np.arange(n) * np.arange(n).sum() + n - 1).tolist()
  assert [row["process"] for row in first] == [0, 1]
  assert first[0]["jax"] != first[1]["jax"]  # what JAX alone would key: process 1 never found process 0's entries
  assert first[0]["job"] == first[1]["job"]
  assert all(row["result"] == expected for row in first)
  # Process 0 writes the entries; process 1 may already be served them when it compiles after process 0 wrote them.
  assert first[0]["program_hits"] == 0, first
  second = _job(str(tmp_path))
  # Every program the job compiles (the update, the gather), on process 1 too, from process 0's entries.
  assert second[0]["program_hits"] == second[1]["program_hits"] >= 1, second
  assert all(row["result"] == expected for row in second)
