"""The README toy's real update shape on a 2-process learner job (`tests/train/multihost_toy_update_worker.py`):
64 trajectories of the toy's lengths in 16 length groups, K = 2 critic epochs, whitening — value pretraining's
learner, then the RL learner's with the actor on. Before `sao.train.mesh_jit`'s serial execution on XLA:CPU this
job deadlocked in value pretraining (processes stuck in different gloo collectives); the shrunk configs of the other
multi-process tests never built enough programs in flight to show it. Every process must report the same metrics."""
import json
import os

import pytest

from tests import multihost


@pytest.mark.slow
def test_toy_update_shape_runs_on_two_processes_with_equal_metrics(tmp_path):
  # 4 devices a process: the pool then has exactly one thread per device part, the tightest case (2 devices a
  # process run in tests/e2e/test_multihost_toy_e2e.py).
  multihost.run_processes("tests.train.multihost_toy_update_worker", num_processes=2, devices_per_process=4,
                          args=["--out", str(tmp_path), "--updates", "2"], timeout_s=600)
  records = [json.load(open(os.path.join(tmp_path, f"p{i}.json"))) for i in range(2)]
  assert sorted(records[0]) == ["rl0", "rl1", "value_pretrain0", "value_pretrain1"]
  assert records[0] == records[1]
  assert records[0]["rl1"]["actor/warmup"] == 0.0 and records[0]["value_pretrain1"]["actor/warmup"] == 1.0
