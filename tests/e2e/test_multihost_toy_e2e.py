"""The documented two-process command on the README toy config itself (docs/tpu.md, "Multi-host trainer"):

    python -m launch.local --trainer_processes=2 --devices_per_process=<2|4> --workdir=<w> -- \\
        --config=experiments/configs/sao_openswe.py:toy

with only the step counts shrunk: 64 trajectories per step of the toy's mixed lengths, 16 length groups, K = 2 critic
epochs, whitening — the shape whose programs deadlocked the job in value pretraining (the other multi-process tests
shrink the batch and never got there). Each job goes through the warm start, value pretraining and RL steps:
- with 4 devices per process, to the `[done]` line a one-process run prints;
- with 2, SIGTERM to both trainer processes during the RL phase stops them at a step boundary with a checkpoint,
  and the same command resumes from it to `[done]`.
"""
from __future__ import annotations

import os
import signal

import pytest

from tests.e2e import test_multihost_e2e as mh
from tests.e2e import test_train_e2e as e2e

pytestmark = pytest.mark.slow

VALUE_STEPS = 2
# Per job: the 4-device one runs one RL step with the actor (no critic warmup) to `[done]`; the 2-device one gets
# SIGTERM once its first RL step is logged, while the second runs (a stop takes effect at the next step boundary),
# and resumes to the third. (Each RL step of this shape is 20-40 s on 2 cores.)
DONE_RL_STEPS, SIGTERM_RL_STEPS = 1, 3


def _step_counts(rl_steps: int, critic_warmup_steps: int) -> str:
  return (f"total_steps={rl_steps},recipe.value_pretrain_steps={VALUE_STEPS},recipe.sft_steps=2,checkpoint_every=1,"
          f"learner.sao.critic_warmup_steps={critic_warmup_steps}")


cache_dir, jobs = mh.cache_dir, mh.jobs  # the fixtures: a compilation cache per module, jobs killed in teardown


def _job(tmp_path, cache_dir, name: str, devices: int, step_counts: str, workdir: str | None = None) -> mh.Job:
  return mh.Job(workdir or str(tmp_path / "run"), cache_dir, name, config_arg=f"sao_openswe.py:toy,{step_counts}",
                devices_per_process=devices)


def _check_toy_rows(workdir: str) -> list[dict]:
  rows = mh._step_rows(workdir)  # pylint: disable=protected-access
  assert rows and all(r["batch/num_trajectories"] == 64 for r in rows if "batch/num_trajectories" in r), rows[:2]
  return rows


def test_toy_two_processes_four_devices_run_to_done(tmp_path, jobs, cache_dir):
  job = _job(tmp_path, cache_dir, "toy4", devices=4, step_counts=_step_counts(DONE_RL_STEPS, 0))
  jobs.append(job)
  out = job.finish(timeout_s=1500)
  assert "[done] sao_openswe_toy: validation" in out, out[-6000:]
  assert "[value pretraining] critic saved" in out
  assert "[done]" not in job.process1_log()
  rows = _check_toy_rows(job.workdir)
  assert [r["step"] for r in rows] == list(range(VALUE_STEPS + DONE_RL_STEPS))
  assert "actor/grad_norm" in rows[-1], rows[-1]  # the RL step trained the actor under this mesh


def test_toy_two_processes_stop_on_sigterm_with_a_checkpoint_and_resume_to_done(tmp_path, jobs, cache_dir):
  step_counts = _step_counts(SIGTERM_RL_STEPS, 1)
  job = _job(tmp_path, cache_dir, "toy2", devices=2, step_counts=step_counts)
  jobs.append(job)
  workdir = job.workdir
  pids = job.wait_for("both trainer processes", lambda: [job.trainer_pid(0), job.trainer_pid(1)]
                      if job.trainer_pid(0) and job.trainer_pid(1) else None, timeout_s=300, poll_s=0.2)
  rl_started = lambda: any(r["step"] >= VALUE_STEPS for r in mh._step_rows(workdir))  # pylint: disable=protected-access
  job.wait_for("the first RL step", rl_started, timeout_s=1200, poll_s=0.2)
  for pid in pids:
    os.kill(pid, signal.SIGTERM)
  try:
    job.process.wait(timeout=120)
  except Exception:  # noqa: BLE001
    pytest.fail(f"the job did not stop within 120 s of SIGTERM:\n{job.output()[-6000:]}")
  out = job.output()
  assert "[trainer] stopped by SIGTERM before rl step" in out, out[-6000:]
  assert "stopped by SIGTERM before rl step" in job.process1_log()
  rows_before = _check_toy_rows(workdir)
  assert len(rows_before) < VALUE_STEPS + SIGTERM_RL_STEPS, "the job finished before SIGTERM"
  resume_step = int(e2e._latest_extra(workdir)["step"])  # pylint: disable=protected-access
  assert resume_step == rows_before[-1]["step"] + 1  # the checkpoint holds every step that ran
  job.kill()
  again = _job(tmp_path, cache_dir, "toy2_again", devices=2, step_counts=step_counts, workdir=workdir)
  jobs.append(again)
  out = again.finish(timeout_s=1500)
  assert "[done] sao_openswe_toy: validation" in out and "[value pretraining]" not in out, out[-6000:]
  resumed = [r["step"] for r in mh._step_rows(workdir)[len(rows_before):]]  # pylint: disable=protected-access
  assert resumed == list(range(resume_step, VALUE_STEPS + SIGTERM_RL_STEPS))
