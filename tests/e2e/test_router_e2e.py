"""End to end with the real `sglang-router`: `experiments/train.py` with `num_engines=2` starts two local JAX engines,
the router in front of them (the rollout worker is given the router's URL only) and trains a tiny SAO run.

- Every publish reaches both engines: each one reports the published version (`fleet/weight_version/<engine>`
  in metrics.jsonl), and every logged trajectory's policy version is one the engines reported.
- Mid-run one engine is SIGKILLed: the run goes on with the other and finishes; the next publish finds the dead
  engine without a version and takes it out of the router's rotation (`fleet/in_rotation/<engine>` = 0); nothing
  is trained on a response the dead engine never finished (a request it dropped is retried, by the router on the
  other engine or by the worker's client, or its episode ends as an `env_error`, which is never trained on).

sglang-router is in the test extra (`pip install -e ".[test]"`); without it this test fails saying so.
"""
from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request

import numpy as np
import pytest

from sao.engines import fleet as fleet_lib
from sao.engines import router as router_lib
from sao.transport import log as log_lib
from tests.e2e.test_train_e2e import COMMON, Run, _cmdline, _group_members, _metrics, _records
from tests.e2e.test_train_e2e import cache_dir, runs  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow

STEPS = 6  # RL steps after 1 value-pretraining step; each after the first (critic warmup) publishes a version
KILL_AFTER_VERSION = 1
FINAL_VERSION = STEPS - 1  # the first RL step is critic warmup; each later one publishes a version
# COMMON's 6 s lease TTL is for its worker-kill test; here nothing kills a worker, and on a busy machine short
# leases only expire and redo work.
# No periodic checkpoint (COMMON saves every step, and a checkpoint waits for its step's publish): the versions are
# published in the background while the next step trains (`sao.train.publication`), as at full scale (the toy's
# default waits for each publish).
ARG = (f"sao_openswe.py:toy,num_engines=2,total_steps={STEPS},recipe.value_pretrain_steps=1,"
       f"learner.sao.critic_warmup_steps=1,critic_trace_every=0,{COMMON},rollout.lease_ttl_s=60,"
       "checkpoint_every=1000,async_publish=True")


def _engine_urls(output: str) -> list[str]:
  match = re.search(r"\[embedded\] engines: (\[.*?\])", output)
  return json.loads(match.group(1).replace("'", '"')) if match else []


def _publishes(workdir: str) -> list[dict]:
  """The metrics rows that carry the fleet's report of a publish (`fleet/published_version`: in the background, the
  step after the publish; the run's last publish in its own step's row)."""
  return [r for r in _metrics(workdir) if "fleet/servers" in r]


def _healthy(url: str) -> bool:
  try:
    with urllib.request.urlopen(url + "/health", timeout=5) as resp:
      return resp.status == 200
  except OSError:
    return False


def _served_version(url: str) -> int:
  with urllib.request.urlopen(url + "/get_model_info", timeout=10) as resp:
    return int(json.load(resp)["weight_version"])


def _freeze_with_versions_to_come(run, workdir: str, engines: list[str], timeout_s: float = 420) -> list[dict]:
  """Freezes the trainer (SIGSTOP) at a moment when both engines serve version >= KILL_AFTER_VERSION but neither
  serves the last one (FINAL_VERSION), so the kill lands between publishes with more to come; returns the publish
  rows logged so far. The engines are asked, not the metrics log (a version is published before its step's row is
  written). The caller resumes the trainer (SIGCONT)."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    assert run.process.poll() is None, run.output()[-3000:]
    os.kill(run.process.pid, signal.SIGSTOP)
    served = [_served_version(u) for u in engines]
    if KILL_AFTER_VERSION <= min(served) and max(served) < FINAL_VERSION:
      return _publishes(workdir)
    os.kill(run.process.pid, signal.SIGCONT)
    assert max(served) < FINAL_VERSION, f"the engines serve the last version ({served}) before one could be killed"
    time.sleep(0.05)
  raise AssertionError(f"no version >= {KILL_AFTER_VERSION} served within {timeout_s} s")


def test_two_engines_behind_the_router_one_killed_mid_run(tmp_path, runs, cache_dir):  # noqa: F811
  router_lib.require_router()  # fails (never skips) with the install command when the extra is missing
  workdir = str(tmp_path / "run")
  run = Run(ARG, workdir, cache_dir, "router")
  runs.append(run)
  out = run.wait_for("the router", lambda: "[embedded] sglang-router" in run.output() and run.output(), 420)
  engines = _engine_urls(out)
  assert len(engines) == 2, out[-3000:]
  router_url = re.search(r"\[embedded\] sglang-router (http://\S+)", out).group(1)
  assert router_url not in engines

  # --- Both engines reach every version published before the kill. The trainer is frozen (SIGSTOP) while the kill
  # is decided and done, so at least one version is still to be published after it (on an idle machine the run
  # could otherwise publish its last version between the check and the kill).
  before_kill = _freeze_with_versions_to_come(run, workdir, engines)
  for row in before_kill:
    assert row["fleet/servers"] == 2 and row["fleet/servers_current"] == 2, row
    assert row["policy_version"] - 1 <= row["fleet/published_version"] <= row["policy_version"], row
    for url in engines:
      name = fleet_lib.metric_name(url)
      assert row[f"fleet/weight_version/{name}"] == row["fleet/published_version"], (url, row)
      assert row[f"fleet/in_rotation/{name}"] == 1.0

  # --- SIGKILL one engine (the session's `sao.engines.serve` processes are the two engines).
  engine_pids = [p for p in _group_members(run.pgid) if "sao.engines.serve" in _cmdline(p)]
  assert len(engine_pids) == 2, engine_pids
  os.kill(engine_pids[1], signal.SIGKILL)
  try:
    dead = run.wait_for("the killed engine to stop answering",
                        lambda: [u for u in engines if not _healthy(u)], 60, poll_s=0.2)
  finally:
    os.kill(run.process.pid, signal.SIGCONT)
  assert len(dead) == 1
  (alive,) = [u for u in engines if u not in dead]
  run.finish(600)

  # --- The run went on: every later publish has the live engine current and the dead one out of the rotation.
  after_kill = _publishes(workdir)[len(before_kill):]
  assert after_kill, "no version was published after the kill"
  last = after_kill[-1]
  assert last["policy_version"] >= KILL_AFTER_VERSION + 1
  assert last["fleet/published_version"] == last["policy_version"]  # the last publish is waited for
  assert last[f"fleet/weight_version/{fleet_lib.metric_name(alive)}"] == last["policy_version"]
  assert last[f"fleet/weight_version/{fleet_lib.metric_name(dead[0])}"] == -1.0
  assert last[f"fleet/in_rotation/{fleet_lib.metric_name(dead[0])}"] == 0.0
  assert last["fleet/servers_current"] == 1 and last["fleet/servers_in_rotation"] == 1
  assert sum("reward" in r for r in _metrics(workdir)) == 1 + STEPS

  # --- Trajectories: their versions are versions the engines reported; the trained ones are whole.
  reported = {0} | {int(r["fleet/published_version"]) for r in _publishes(workdir) if r["fleet/servers_current"] >= 1}
  records = _records(workdir)
  versions = {r.trajectory.policy_version for r in records}
  assert versions <= reported, (versions, reported)
  assert any(v >= 1 for v in versions), versions
  consumed = log_lib.read_consumed(os.path.join(workdir, "trajectories"))
  for r in records:
    t = r.trajectory
    if r.key in consumed and t.is_trainable:
      lp = np.asarray(t.rollout_logprobs)[np.asarray(t.action_mask, bool)]
      assert lp.size and np.all(np.isfinite(lp)) and np.all(lp <= 0), (t.task_id, t.status)
