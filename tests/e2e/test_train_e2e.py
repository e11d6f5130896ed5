"""End to end through every process: `experiments/train.py` (trainer + local engine + rollout worker subprocesses)
on a tiny number_search config, with faults injected from outside.

- SAO: trajectories flow into the durable log, the actor updates and its weights are published and picked up
  (`policy/v1`, logged trajectories with `policy_version >= 1`), metrics land in `metrics.jsonl`, TensorBoard and
  `curves.png`. Mid-run the rollout worker is SIGKILLed: its leases expire (short TTL), the trainer restarts the
  worker, the tasks are re-leased and none is lost. Then the whole run (its session) is SIGKILLed; the same
  command resumes at the checkpoint's step and trains first on the trajectories that were accepted but not consumed.
- GSPO: groups of G rollouts per task are leased, logged and trained on whole, and metrics land as for SAO. GRPO
  runs the same system with another actor loss (`ppo_clip`, held to a NumPy reference in tests/train/test_grpo.py);
  one group method's run here covers both (a GRPO run of its own took another ~90 s of the suite).

Each run is started in its own session and every process of it is SIGKILLed in teardown, so no engine or
worker outlives the test. All runs share one JAX persistent compilation cache to keep the file's runtime down.
"""
from __future__ import annotations

import collections
import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from sao.analysis import critic_traces
from sao.transport import log as log_lib
from tests import multihost

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BATCH = 8
LEASE_TTL_S = 6.0  # short, so the killed worker's leases lapse quickly; heartbeats every TTL/3 keep live ones
# Tiny everything: 16-number search (6 turns), 16 new tokens a turn, 2 validation episodes per policy version. The
# buffer holds one batch (the worker is pushed back beyond), so the learner soon starves when the worker dies.
COMMON = ("recipe.sft_steps=5,recipe.num_demonstrations=50,log_every=1,rollout.eval_every=1,"
          f"rollout.batch_size={BATCH},rollout.concurrency=8,rollout.max_new_tokens=16,rollout.max_total_tokens=160,"
          f"rollout.lease_ttl_s={LEASE_TTL_S},env.kwargs.n=16,env.num_validation_tasks=2,checkpoint_every=1,"
          f"keep_policy_exports=100,server.buffer_capacity={BATCH}")
SAO_STEPS = 6  # RL steps, after 1 value-pretraining step
SAO_ARG = (f"sao_openswe.py:toy,total_steps={SAO_STEPS},recipe.value_pretrain_steps=1,"
           f"learner.sao.critic_warmup_steps=1,critic_trace_every=2,{COMMON}")
GROUP = 4  # G; BATCH = 2 tasks × 4 samples
GSPO_STEPS = 4  # step 0 publishes v1; later steps sample from it (with 3, a fast machine sampled all from v0)
# One base validation pass of the 2 validation tasks instead of 4.
GSPO_ARG = (f"gspo_openswe.py:toy,total_steps={GSPO_STEPS},rollout.group_size={GROUP},{COMMON},"
            "rollout.base_eval_repeats=1")


# ----------------------------------------------------------------------------------------------------------------
# Process helpers.

def _group_members(sid: int) -> list[int]:
  """Live pids (not zombies) of the session `sid` (a run's trainer and its engines and workers, each child in a
  process group of its own)."""
  out = []
  for stat in glob.glob("/proc/[0-9]*/stat"):
    try:
      with open(stat) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if int(fields[3]) == sid and fields[0] != "Z":  # fields: state, ppid, pgrp, session, ...
      out.append(int(stat.split("/")[2]))
  return out


def _cmdline(pid: int) -> str:
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return f.read().replace(b"\0", b" ").decode(errors="replace")
  except OSError:
    return ""


def _worker_pids(pgid: int) -> list[int]:
  return [p for p in _group_members(pgid) if "sao.rollout.worker" in _cmdline(p)]


def _kill_group(process: subprocess.Popen, timeout_s: float = 20.0) -> None:
  """SIGKILLs every process of the run's session and waits (bounded) until none of it is left."""
  for pid in [process.pid] + _group_members(process.pid):
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  try:
    process.wait(timeout=timeout_s)
  except subprocess.TimeoutExpired:
    pass
  deadline = time.monotonic() + timeout_s
  while _group_members(process.pid) and time.monotonic() < deadline:
    time.sleep(0.2)


class Run:
  """One `experiments/train.py` invocation in its own session; stdout+stderr to a file."""

  def __init__(self, config_arg: str, workdir: str, cache_dir: str, name: str):
    env = dict(os.environ)
    # The test process fakes 8 CPU devices (conftest); the real command runs on the host's one CPU device.
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if "xla_force_host_platform_device_count" not in f)
    env.update(JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", **multihost.compilation_cache_env(cache_dir))
    self.out_path = os.path.join(os.path.dirname(workdir), f"{name}.out")
    self.workdir = workdir
    with open(self.out_path, "wb") as out:
      self.process = subprocess.Popen(
          [sys.executable, "experiments/train.py", f"--config=experiments/configs/{config_arg}",
           f"--workdir={workdir}"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
          stdin=subprocess.DEVNULL, start_new_session=True)
    self.pgid = self.process.pid

  def output(self) -> str:
    with open(self.out_path, errors="replace") as f:
      return f.read()

  def wait_for(self, what: str, predicate, timeout_s: float, poll_s: float = 1.0):
    """Polls `predicate()` until truthy (returned) or the run exits or `timeout_s` passes (test failure)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
      value = predicate()
      if value:
        return value
      if self.process.poll() is not None:
        pytest.fail(f"run exited with code {self.process.returncode} while waiting for {what}; output tail:\n"
                    f"{self.output()[-6000:]}")
      time.sleep(poll_s)
    pytest.fail(f"timed out after {timeout_s}s waiting for {what}; output tail:\n{self.output()[-6000:]}")

  def finish(self, timeout_s: float) -> str:
    try:
      self.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      pytest.fail(f"run did not finish within {timeout_s}s; output tail:\n{self.output()[-6000:]}")
    out = self.output()
    assert self.process.returncode == 0, f"run failed (code {self.process.returncode}):\n{out[-6000:]}"
    return out

  def kill(self) -> None:
    _kill_group(self.process)

  def kill_when(self, what: str, predicate, timeout_s: float) -> None:
    """Kills the run at a moment `predicate()` holds. The trainer is frozen (SIGSTOP) before the check that decides,
    so it cannot change the state (consume the pending trajectories, say) between that check and the kill."""
    deadline = time.monotonic() + timeout_s
    while True:
      self.wait_for(what, predicate, max(deadline - time.monotonic(), 1.0), poll_s=0.2)
      os.kill(self.process.pid, signal.SIGSTOP)
      if predicate():
        self.kill()
        return
      os.kill(self.process.pid, signal.SIGCONT)


@pytest.fixture
def runs():
  started: list[Run] = []
  yield started
  for run in started:
    run.kill()
    assert not _group_members(run.pgid), f"leftover processes of {run.out_path}: {_group_members(run.pgid)}"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return os.environ.get("SAO_E2E_JAX_CACHE") or str(tmp_path_factory.mktemp("jax_cache"))


# ----------------------------------------------------------------------------------------------------------------
# Run-directory readers.

def _records(workdir: str) -> list[log_lib.LogRecord]:
  return list(log_lib.read_records(os.path.join(workdir, "trajectories")))


def _metrics(workdir: str) -> list[dict]:
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for line in f:
      try:
        rows.append(json.loads(line))
      except ValueError:
        pass  # a line being written
  return rows


def _num_steps(workdir: str) -> int:
  """Learner steps logged so far (validation results are rows of their own, without `reward`)."""
  return sum("reward" in r for r in _metrics(workdir))


def _checkpoint_metas(workdir: str) -> dict[int, dict]:
  """Learner update -> the checkpoint's meta JSON (orbax `JsonSave` item "meta"), for completely written steps."""
  out = {}
  for step_dir in glob.glob(os.path.join(workdir, "checkpoints", "[0-9]*")):
    if not os.path.basename(step_dir).isdigit():
      continue  # orbax's `<step>.orbax-checkpoint-tmp-*` while a save is in flight
    for path in glob.glob(os.path.join(step_dir, "meta", "*")):
      try:
        with open(path) as f:
          meta = json.load(f)
      except (OSError, ValueError):
        continue
      if isinstance(meta, dict) and "extra" in meta:
        out[int(os.path.basename(step_dir))] = meta
  return out


def _latest_extra(workdir: str) -> dict | None:
  metas = _checkpoint_metas(workdir)
  return metas[max(metas)]["extra"] if metas else None


def _lease_order(config_arg: str, n: int) -> list[str]:
  """The group ids of the first `n` training leases the run's dispenser hands out (its order is a function of the
  seed and the task list only)."""
  from experiments.configs import sao_openswe  # pylint: disable=g-import-not-at-top
  from sao.rollout import envs  # pylint: disable=g-import-not-at-top
  from sao.transport.dispenser import DispenserConfig, TaskDispenser  # pylint: disable=g-import-not-at-top
  config = sao_openswe.get_config(config_arg.split(":", 1)[1])
  # As experiments/train.py builds the training task list.
  train_tasks = envs.make(config.env.name, **config.env.kwargs).tasks("train", config.env.num_train_tasks,
                                                                      config.seed)
  dispenser = TaskDispenser(train_tasks, DispenserConfig(mode="sao", seed=config.seed, id_key="task_id",
                                                         lease_ttl_s=1e6))
  return [lease.group_id for lease in dispenser.lease("probe", n)]


def _check_outputs(workdir: str, expect_validation: bool = True) -> list[dict]:
  """Weights published and picked up, metrics written (JSONL, TensorBoard, curves)."""
  records = _records(workdir)
  assert records, "no trajectory in the durable log"
  assert os.path.isfile(os.path.join(workdir, "policy", "v1", "config.json")), os.listdir(workdir)
  versions = collections.Counter(r.trajectory.policy_version for r in records)
  assert any(v >= 1 for v in versions), f"no trajectory sampled from a published policy: {versions}"
  rows = _metrics(workdir)
  assert any("reward" in r for r in rows), rows[:3]
  waits = [r["trainer/wait_s"] for r in rows if "reward" in r]  # every step says how long it waited for its batch
  assert len(waits) == sum("reward" in r for r in rows) and all(w >= 0 for w in waits), rows[:3]
  if expect_validation:
    assert any("validation" in r for r in rows), "no validation metric"
  assert glob.glob(os.path.join(workdir, "tensorboard", "**", "events.out.tfevents.*"), recursive=True) or \
      glob.glob(os.path.join(workdir, "**", "events.out.tfevents.*"), recursive=True), "no TensorBoard events"
  assert os.path.getsize(os.path.join(workdir, "curves.png")) > 0
  return rows


# ----------------------------------------------------------------------------------------------------------------
# Tests.

def test_sao_end_to_end_with_worker_and_trainer_kills(tmp_path, runs, cache_dir):
  workdir = str(tmp_path / "run")
  end_step = 1 + SAO_STEPS  # value pretraining + RL steps

  # --- Run A: kill the rollout worker once trajectories flow and the RL phase has started.
  run_a = Run(SAO_ARG, workdir, cache_dir, "a")
  runs.append(run_a)
  run_a.wait_for("the first RL step", lambda: any(r.get("phase/rl") for r in _metrics(workdir)), 420)
  assert _records(workdir), "metrics without trajectories in the log"
  workers = run_a.wait_for("a rollout worker", lambda: _worker_pids(run_a.pgid), 30)
  position_at_kill = run_a.wait_for("a checkpoint", lambda: _latest_extra(workdir), 60)["dispenser"]["position"]
  os.kill(workers[0], signal.SIGKILL)
  kill_time = time.monotonic()
  steps_at_worker_kill = _num_steps(workdir)
  run_a.wait_for("the worker restart", lambda: [p for p in _worker_pids(run_a.pgid) if p != workers[0]], 120)
  assert "rollout worker 0 exited with code -9; restarted it" in run_a.output()
  # Training goes on after the kill: two more steps.
  run_a.wait_for("steps after the worker kill", lambda: _num_steps(workdir) >= steps_at_worker_kill + 2, 300)
  assert time.monotonic() - kill_time > LEASE_TTL_S

  # --- Kill the whole run (its session) once a checkpoint is written and some accepted trajectories wait.
  log_dir = os.path.join(workdir, "trajectories")
  run_a.kill_when("an unconsumed trajectory after a checkpoint",
                  lambda: _latest_extra(workdir) and log_lib.unconsumed(log_dir), 120)
  assert not _group_members(run_a.pgid), "processes of the killed run are left"
  resume_step = int(_latest_extra(workdir)["step"])
  assert 1 < resume_step < end_step, resume_step
  pending = [r.key for r in log_lib.unconsumed(log_dir)]
  rows_before = len(_metrics(workdir))
  assert pending

  # --- Run B: the same command resumes.
  run_b = Run(SAO_ARG, workdir, cache_dir, "b")
  runs.append(run_b)
  out_b = run_b.finish(600)
  assert "[sft]" not in out_b and "[value pretraining]" not in out_b, "resume redid a finished phase"
  rows = _metrics(workdir)
  resumed_rows = [r for r in rows[rows_before:] if "reward" in r]
  assert resumed_rows and resumed_rows[0]["step"] == resume_step, (resume_step, resumed_rows[:1])
  assert resumed_rows[-1]["step"] == end_step - 1
  assert _latest_extra(workdir)["step"] == end_step
  # Validations run A logged before its last checkpoint (the base policy's among them) survive the resume.
  validated_a = {r["validation/policy_version"] for r in rows[:rows_before]
                 if "validation/policy_version" in r and r["step"] < resume_step}
  final_validations = _latest_extra(workdir)["validations"]
  assert 0 in validated_a and validated_a <= {v for v, _ in final_validations}, (validated_a, final_validations)
  # Accepted-but-unconsumed trajectories were reloaded from the log and trained on first, after the resume.
  consumed = log_lib.read_consumed(log_dir)
  first = pending[:BATCH]
  assert all(k in consumed and consumed[k] >= resume_step for k in first), (first, consumed)

  _check_outputs(workdir)
  # No task lost: every task leased before the worker was killed has its trajectory in the log (the dead worker's
  # leases expired and were re-leased) or is still owed at the end (leased or queued for re-lease in the final
  # dispenser state); and no sample was logged twice.
  records = _records(workdir)
  logged = collections.Counter(r.trajectory.group_id for r in records)
  final = _latest_extra(workdir)["dispenser"]
  owed = {l["work"]["group_id"] for l in final["leases"]} | {w["group_id"] for w in final["retry"]}
  order = _lease_order(SAO_ARG, position_at_kill)
  missing = [g for g in order if g not in logged and g not in owed]
  assert not missing, f"tasks leased before the worker kill were lost: {missing}"
  assert sum(g in logged for g in order) >= len(order) - 2 * BATCH, "most early tasks should be done by the end"
  keys = collections.Counter(r.key for r in records)
  assert max(keys.values()) == 1
  # Critic traces every 2 steps (value pretraining's step 0 included), at most one success and one failure each,
  # whose task ids and rewards are logged trajectories' and whose return targets equal the reward (γ = λ = 1).
  traces = critic_traces.read_traces(workdir)
  assert traces and {t.step for t in traces} <= set(range(0, end_step, 2)) and 0 in {t.step for t in traces}
  rewards = {r.trajectory.task_id: r.trajectory.reward for r in records}
  for t in traces:
    assert t.reward == rewards[t.task_id] and (t.kind == "success") == (t.reward > 0)
    np.testing.assert_allclose(t.returns[t.action_mask], t.reward, atol=1e-5)


def test_gspo_end_to_end(tmp_path, runs, cache_dir):
  workdir = str(tmp_path / "run")
  run = Run(GSPO_ARG, workdir, cache_dir, "gspo")
  runs.append(run)
  out = run.finish(600)
  assert "[value pretraining]" not in out, "GSPO has no critic to pretrain"
  rows = _check_outputs(workdir)
  steps = [r for r in rows if "reward" in r]
  assert [r["step"] for r in steps] == list(range(GSPO_STEPS)), [r.get("step") for r in steps]
  for r in steps:
    assert r["batch/num_trajectories"] == BATCH, r
    assert 0.0 <= r["actor/clip_fraction"] <= 1.0 and r["actor/skipped"] == 0, r
    assert not any(k.startswith("critic/") for k in r), "GSPO has no critic"
    # The 5-step warm start rarely solves a task: a batch whose groups all have equal rewards has Â = 0 and exactly
    # no gradient; one with a mixed group moves the policy.
    assert (r["actor/grad_norm"] > 0) == (r["advantages/std"] > 0), r
  # Every group the learner trained on is complete: G samples 0..G-1 of one task (whatever lease each came under).
  consumed = log_lib.read_consumed(os.path.join(workdir, "trajectories"))
  assert len(consumed) == GSPO_STEPS * BATCH
  groups, trained, tasks = collections.defaultdict(set), collections.defaultdict(set), collections.defaultdict(set)
  for rec in _records(workdir):
    traj = rec.trajectory
    groups[traj.group_id].add(traj.sample_index)
    if rec.key in consumed:
      trained[traj.group_id].add(traj.sample_index)
      tasks[traj.group_id].add(traj.task_id)
  assert all(idx <= set(range(GROUP)) for idx in groups.values()), dict(groups)
  assert len(trained) == GSPO_STEPS * BATCH // GROUP, dict(trained)
  assert all(idx == set(range(GROUP)) for idx in trained.values()), dict(trained)
  assert all(len(t) == 1 for t in tasks.values()), dict(tasks)
  assert not os.path.exists(os.path.join(workdir, critic_traces.TRACES_FILE)), "GSPO has no critic to trace"
