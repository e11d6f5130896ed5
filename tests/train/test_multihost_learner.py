"""The learner as a 2-process JAX job (2 × 4 CPU devices) against 1 process × 8 devices, same mesh shape.

Three jobs of tests/train/multihost_learner_worker.py, run once for the module (process start-up and compilation
dominate): the 1-process reference, the 2-process run (SIGKILLed at its end: nothing may depend on a clean shutdown)
and a fresh 2-process job resuming from the run's checkpoint. The reference runs alongside the 2-process run.
"""
import concurrent.futures
import json
import os

import jax
import numpy as np
import pytest

from sao.models import hf
from tests import multihost

pytestmark = pytest.mark.slow

WORKER = "tests/train/multihost_learner_worker.py"
UPDATES, CHECKPOINT_AT = 4, 2  # as in the worker


def _load(path):
  with np.load(path) as f:
    return {k: f[k] for k in f.files}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("multihost_learner"))
  # One persistent compilation cache for the jobs: the resume finds the 2-process run's programs there.
  env = multihost.compilation_cache_env(str(tmp_path_factory.mktemp("jax_cache")))
  with concurrent.futures.ThreadPoolExecutor(1) as pool:  # the reference alongside: compilation is single-threaded
    reference = pool.submit(multihost.run_processes, WORKER, num_processes=1, devices_per_process=8,
                            args=["run", "--out", out], timeout_s=900, env=env)
    killed = multihost.run_processes(WORKER, num_processes=2, devices_per_process=4,
                                     args=["run", "--out", out, "--kill"], timeout_s=900, env=env, check=False)
    reference.result()
  assert [r.returncode for r in killed] == [-9, -9], multihost._tails(killed)
  multihost.run_processes(WORKER, num_processes=2, devices_per_process=4, args=["resume", "--out", out],
                          timeout_s=900, env=env)
  return out


def _metrics(record, key):
  return json.loads(str(record[key]))


def _assert_metrics_close(got: dict, want: dict, name: str) -> None:
  """The scalars are means over the batch's tokens of O(1)–O(10) terms (losses and explained variances cancel to
  far less), summed in another order across processes: up to ~N ulp of that scale (N ≤ 128 tokens here), so 1e-5 of
  it, as tests/train/test_learner.py allows (observed: ≤ 5e-7)."""
  assert got.keys() == want.keys(), name
  for key in want:
    np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-5, err_msg=f"{name}: {key}")


def test_every_process_returns_the_same_values(jobs):
  for mode in ("run2", "resume2"):
    p0, p1 = _load(os.path.join(jobs, f"{mode}-p0.npz")), _load(os.path.join(jobs, f"{mode}-p1.npz"))
    assert p0.keys() == p1.keys()
    for key in p0:
      np.testing.assert_array_equal(p1[key], p0[key], err_msg=f"{mode}: {key}")


def test_two_processes_equal_one_process(jobs):
  one, two = _load(os.path.join(jobs, "run1-p0.npz")), _load(os.path.join(jobs, "run2-p0.npz"))
  assert one.keys() == two.keys()
  for update in range(UPDATES):
    want = _metrics(one, f"metrics{update}")
    _assert_metrics_close(_metrics(two, f"metrics{update}"), want, f"SAO update {update}")
    assert want["batch/padded_rows"] == 8.0 and want["batch/num_trajectories"] == 7.0
    assert want["actor/warmup"] == float(update < 1) and "critic/loss_epoch1" in want
  assert "actor/dis_masked_fraction" in want and abs(want["advantages/std"] - 1.0) < 1e-3  # DIS, whitened
  _assert_metrics_close(_metrics(two, "gspo_metrics"), _metrics(one, "gspo_metrics"), "GSPO")
  _assert_metrics_close(_metrics(two, "across_metrics"), _metrics(one, "across_metrics"), "tensor across processes")
  assert list(two["counters"]) == list(one["counters"]) == [UPDATES, UPDATES - 1]
  assert bool(two["critic_reloaded"]) and bool(one["critic_reloaded"])
  arrays = [k for k in one if not k.startswith(("metrics", "gspo_metrics", "across_metrics", "counters"))]
  assert any(k.startswith("trace") for k in arrays) and any(k.startswith("gspo_") for k in arrays)
  # Params, Adam moments, step counters, rng, traces (rows 0, 6 and the padding row 7). Adam eps = 1 (the worker's
  # `_config`): a param moves by lr·g/(|g| + 1), so the gradients' reduction-order rounding reaches it scaled down by
  # lr (observed: ≤ 1.2e-7 for the O(1) advantages, ≤ 1e-8 for params).
  for key in arrays:
    np.testing.assert_allclose(two[key], one[key], rtol=0, atol=1e-6, err_msg=key)


def test_resume_with_two_processes_is_bit_exact(jobs):
  straight, resumed = _load(os.path.join(jobs, "run2-p0.npz")), _load(os.path.join(jobs, "resume2-p0.npz"))
  assert json.loads(str(resumed["extra"])) == {"dispenser": {"next_task": 11}}
  assert list(resumed["counters"]) == list(straight["counters"])
  for update in range(CHECKPOINT_AT, UPDATES):
    assert _metrics(resumed, f"metrics{update}") == _metrics(straight, f"metrics{update}")
  state = [k for k in straight if k.startswith("sao_") or k.startswith(f"trace{UPDATES - 1}")]
  assert len(state) > 10
  for key in state:  # actor and critic TrainStates and the learner's rng
    np.testing.assert_array_equal(resumed[key], straight[key], err_msg=key)


def test_two_process_export_loads_like_a_one_process_export(jobs):
  import torch
  import transformers

  two = _load(os.path.join(jobs, "run2-p0.npz"))
  # The trained, tensor-sharded params: the export holds exactly the gathered values.
  _, trained = hf.load_pretrained(os.path.join(jobs, "trained2"))
  host = [two[f"host_{i}"] for i in range(len(jax.tree.leaves(trained)))]
  for x, y in zip(host, jax.tree.leaves(trained)):
    np.testing.assert_array_equal(np.asarray(y), x)
  assert len(os.listdir(os.path.join(jobs, "export2"))) == 4  # one safetensors file per process, index, config
  ids = torch.tensor([[1, 5, 9, 13, 2, 7]])
  logits = []
  for name in ("export1", "export2"):
    model = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(jobs, name), torch_dtype=torch.float32)
    with torch.no_grad():
      logits.append(model(ids).logits.numpy())
  np.testing.assert_array_equal(logits[1], logits[0])
