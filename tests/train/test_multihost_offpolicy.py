"""The off-policy options in a 2-process learner job (2 × 4 CPU devices) against 1 process × 8 devices: V-trace
critic targets (one-call and length-grouped) and the explained-variance actor start give every process the same
values and plans, and the same values as one process."""
import concurrent.futures
import json
import os

import numpy as np
import pytest

from tests import multihost

pytestmark = pytest.mark.slow

WORKER = "tests/train/multihost_offpolicy_worker.py"


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("multihost_offpolicy"))
  env = multihost.compilation_cache_env(str(tmp_path_factory.mktemp("jax_cache")))
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    one = pool.submit(multihost.run_processes, WORKER, num_processes=1, devices_per_process=8, args=["--out", out],
                      timeout_s=900, env=env)
    multihost.run_processes(WORKER, num_processes=2, devices_per_process=4, args=["--out", out], timeout_s=900,
                            env=env)
    one.result()
  return out


def _load(jobs, name):
  with np.load(os.path.join(jobs, name)) as f:
    return {k: f[k] for k in f.files}


def test_processes_agree_and_match_one_process(jobs):
  p0, p1, one = (_load(jobs, n) for n in ("2-p0.npz", "2-p1.npz", "1-p0.npz"))
  assert p0.keys() == p1.keys() == one.keys()
  for key in p0:
    np.testing.assert_array_equal(p1[key], p0[key], err_msg=key)
  for key in one:
    if key.endswith("_plans"):
      continue
    if "metrics" in key:
      got, want = json.loads(str(p0[key])), json.loads(str(one[key]))
      assert got.keys() == want.keys(), key
      for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=f"{key}: {k}")
    else:
      np.testing.assert_allclose(p0[key], one[key], rtol=1e-5, atol=1e-5, err_msg=key)
  plans = json.loads(str(p0["vtrace_gate_plans"]))
  assert [p["actor_step"] for p in plans] == [False, True, True]  # the gate opened on the first full window
  assert [p["actor_start"]["started_at"] for p in plans] == [None, 1, 1]
  assert all(p["critic_target_correction"] == "vtrace" and p["values_before"] for p in plans)
  assert int(p0["vtrace_gate_version"]) == 2 and int(p0["grouped_version"]) == 2
  assert "critic/vtrace_rho_clipped_fraction" in json.loads(str(p0["grouped_metrics0"]))
  assert json.loads(str(one["vtrace_gate_plans"])) == []  # one process agrees with nobody
