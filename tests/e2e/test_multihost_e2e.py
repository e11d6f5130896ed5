"""End to end as a 2-process trainer job (`python -m launch.local --trainer_processes=2`): the toy SAO config with a
local engine and a rollout worker over gRPC, both started by process 0, for a few RL steps.

One job, then its resume (one test: a job is ~1.5 minutes on 2 cores, most of it start-up and compilation):
- A fault: process 1 is SIGKILLed after the first RL checkpoint; process 0 exits non-zero within 60 s with a message
  naming process 1.
- The same command resumes from the checkpoint (no warm start or value pretraining again) and finishes.
- Both jobs: exactly one gRPC trajectory service (process 0's), one engine and one worker; one metrics row per
  learner step; every policy version published once (one export directory and one weight update per version).

Each job runs in its own session, SIGKILLed whole in teardown. Measured on 2 CPU cores: 115 s for both jobs alone
on the machine with a cold compilation cache (a separate whole run per check took 81 s more in the suite).
"""
from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from tests import multihost
from tests.e2e import test_train_e2e as e2e

pytestmark = pytest.mark.slow

REPO = e2e.REPO
VALUE_STEPS, RL_STEPS = 1, 4
CONFIG_ARG = (f"sao_openswe.py:toy,total_steps={RL_STEPS},recipe.value_pretrain_steps={VALUE_STEPS},"
              f"learner.sao.critic_warmup_steps=1,critic_trace_every=2,{e2e.COMMON}")
HEARTBEAT_TIMEOUT_S = 20


class Job(e2e.Run):
  """One `launch.local --trainer_processes=2` invocation in its own session; the launcher's output (process 0's) to a
  file. Waiting, finishing, output and killing are `e2e.Run`'s."""

  def __init__(self, workdir: str, cache_dir: str, name: str, config_arg: str = CONFIG_ARG,
               devices_per_process: int = 2):
    env = dict(os.environ)
    env.update(PYTHONUNBUFFERED="1", **multihost.compilation_cache_env(cache_dir))
    self.workdir = workdir
    self.out_path = os.path.join(os.path.dirname(workdir), f"{name}.out")
    with open(self.out_path, "wb") as out:
      self.process = subprocess.Popen(
          [sys.executable, "-m", "launch.local", "--trainer_processes=2",
           f"--devices_per_process={devices_per_process}", f"--workdir={workdir}", "--", f"--config=experiments/configs/{config_arg}",
           f"--config.distributed.heartbeat_timeout_s={HEARTBEAT_TIMEOUT_S}"],
          cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    self.pgid = self.process.pid

  def process1_log(self) -> str:
    with open(os.path.join(self.workdir, "logs", "trainer_process1.log"), errors="replace") as f:
      return f.read()

  def trainer_pid(self, process_id: int) -> int | None:
    for pid in e2e._group_members(self.pgid):  # pylint: disable=protected-access
      cmdline = e2e._cmdline(pid)  # pylint: disable=protected-access
      if "experiments/train.py" in cmdline and f"--config.distributed.process_id={process_id}" in cmdline:
        return pid
    return None


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return os.environ.get("SAO_E2E_JAX_CACHE") or str(tmp_path_factory.mktemp("jax_cache"))


@pytest.fixture
def jobs():
  started: list[Job] = []
  yield started
  for job in started:
    job.kill()
    assert not e2e._group_members(job.pgid), f"leftover processes of {job.out_path}"  # pylint: disable=protected-access


def _step_rows(workdir: str) -> list[dict]:
  return [r for r in e2e._metrics(workdir) if "reward" in r]  # pylint: disable=protected-access


class EngineWatcher(threading.Thread):
  """Polls the job's engine (`/get_model_info`) while the job runs: (served weight version, weight updates so far)
  snapshots, taken under the engine's lock that swaps the weights."""

  def __init__(self, job: Job):
    super().__init__(daemon=True)
    self.job, self.seen, self.stop = job, [], threading.Event()

  def run(self):
    url = None
    while not self.stop.wait(0.3):
      if url is None:
        found = re.search(r"\[embedded\] engines: \['(http://[^']+)'\]", self.job.output())
        url = found and found.group(1)
        continue
      try:
        with urllib.request.urlopen(f"{url}/get_model_info", timeout=5) as response:
          info = json.load(response)
      except OSError:
        continue  # not up yet, or gone with the job
      self.seen.append((int(info["weight_version"]), int(info["stats"]["weight_updates"])))


def test_two_process_job_stops_naming_a_killed_process_then_resumes_with_one_service_and_one_publish_per_version(
    tmp_path, jobs, cache_dir):
  workdir = str(tmp_path / "run")
  first = Job(workdir, cache_dir, "first")
  jobs.append(first)
  pids = first.wait_for("both trainer processes", lambda: [first.trainer_pid(0), first.trainer_pid(1)]
                        if first.trainer_pid(0) and first.trainer_pid(1) else None, timeout_s=300, poll_s=0.2)
  # After the first RL update's checkpoint (something to resume from). Process 0 is frozen for the kill, so the job
  # cannot finish between the check and the kill (process 1 only follows process 0).
  first.wait_for("a checkpoint", lambda: e2e._checkpoint_metas(workdir),  # pylint: disable=protected-access
                 timeout_s=1200, poll_s=0.2)
  os.kill(pids[0], signal.SIGSTOP)
  assert len(_step_rows(workdir)) < VALUE_STEPS + RL_STEPS, "the job finished before process 1 could be killed"
  os.kill(pids[1], signal.SIGKILL)
  killed = time.monotonic()
  os.kill(pids[0], signal.SIGCONT)
  try:
    first.process.wait(timeout=60)
  except subprocess.TimeoutExpired:
    pytest.fail(f"the job did not stop within 60 s of losing process 1:\n{first.output()[-6000:]}")
  assert time.monotonic() - killed <= 60
  out = first.output()
  assert first.process.returncode != 0
  assert "process 1 of the trainer job is lost" in out, out[-6000:]
  # Until then: one trajectory service, one engine and one worker, all process 0's; the warm start and value
  # pretraining ran in both processes (their artifacts exist), and process 1 never ran a phase of its own.
  _assert_one_service_engine_and_worker(out, first.process1_log(), workdir)
  assert "[sft]" in out and os.path.isdir(os.path.join(workdir, "value_init"))
  rows_before = _step_rows(workdir)  # the first job's, all written: it has exited
  checkpointed = max(e2e._checkpoint_metas(workdir))  # pylint: disable=protected-access
  resume_step = int(e2e._latest_extra(workdir)["step"])  # pylint: disable=protected-access
  first.kill()  # anything left of the session (nothing should be)

  # The same command resumes from the checkpoint (no warm start or value pretraining again) and finishes.
  again = Job(workdir, cache_dir, "again")
  jobs.append(again)
  watcher = EngineWatcher(again)
  watcher.start()
  out = again.finish(timeout_s=1500)
  watcher.stop.set()
  watcher.join()
  assert "[sft]" not in out and "[value pretraining]" not in out
  assert "[done]" in out
  log1 = again.process1_log()
  _assert_one_service_engine_and_worker(out, log1, workdir)
  assert "[done]" not in log1 and "[rl] step" not in log1
  assert max(e2e._checkpoint_metas(workdir)) > checkpointed  # pylint: disable=protected-access
  # One metrics row per learner step: the first job's up to the kill, then the resumed job's from its checkpoint.
  assert [r["step"] for r in rows_before] == list(range(len(rows_before)))
  resumed = [r["step"] for r in _step_rows(workdir)[len(rows_before):]]
  assert resumed == list(range(resume_step, VALUE_STEPS + RL_STEPS)), (resume_step, resumed)
  # Every version published once: its export directory, and one weight update of the engine per new version (the
  # resumed job's engine starts at the checkpoint's version; two publishers would make two updates per version).
  versions = sorted(int(os.path.basename(p)[1:]) for p in glob.glob(os.path.join(workdir, "policy", "v*"))
                    if not p.endswith(".tmp"))
  last_version = int(_step_rows(workdir)[-1]["policy_version"])
  # (The resumed job exports the checkpoint's version for its engine to start from: v0 when that was the base.)
  assert last_version >= 1 and versions[0] <= 1, (last_version, versions)
  assert versions == list(range(versions[0], last_version + 1)), (last_version, versions)
  published = [(v, n) for v, n in watcher.seen if v >= 1]
  assert published, watcher.seen
  assert len({v - n for v, n in published}) == 1, published


def _assert_one_service_engine_and_worker(out: str, log1: str, workdir: str) -> None:
  assert len(re.findall(r"trajectory service on 127\.0\.0\.1:\d+", out)) == 1, out[-4000:]
  assert "trajectory service" not in log1 and "[embedded]" not in log1
  assert sorted(os.path.basename(p) for p in glob.glob(os.path.join(workdir, "logs", "*.log"))) == [
      "engine0.log", "trainer_process1.log", "worker0.log"]
