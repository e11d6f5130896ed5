"""The issue-21 sweeps (toy_algorithms, toy_matched_concurrency, toy_ablations): arms, equal budgets, one factor per
ablation arm that really reaches the config; code-version stamps and the launcher's refusal to mix versions."""
from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from launch import local
from launch import sweep as s
from sao import run_config

REFERENCE_KEYS_CHANGED = {
    "no_whitening": {"learner.sao.whiten_advantages": False},
    "warmup0": {"learner.sao.critic_warmup_steps": 0},
    "warmup10": {"learner.sao.critic_warmup_steps": 10},
    "critic_clip1": {"learner.critic.optimizer.clip_norm": 1.0},
    "cold_critic": {"recipe.value_pretrain_steps": 0, "learner.critic.optimizer.total_steps": 240},
    "critic_attention": {"learner.critic.frozen_params": (".*visual.*",)},
    "critic_epochs1": {"learner.sao.critic_epochs": 1},
    "fixed_lambda": {"learner.sao.lambda_policy": 0.95},
}


def _flat(config) -> dict:
  out = {}

  def walk(node, prefix):
    for key, value in node.items():
      if hasattr(value, "items"):
        walk(value, f"{prefix}{key}.")
      else:
        out[f"{prefix}{key}"] = value
  walk(config, "")
  return out


def test_toy_algorithms_equal_budgets_and_seeds():
  runs = s.load_sweep(s.sweep_path("toy_algorithms"))
  assert sorted({r.arm for r in runs}) == ["grpo", "gspo", "sao"]
  for arm in ("sao", "gspo", "grpo"):
    assert sorted(r.overrides["seed"] for r in runs if r.arm == arm) == [0, 1, 2, 3, 4]
  assert {s.rl_trajectory_budget(r) for r in runs} == {240 * 64}
  algorithms = {r.arm: s.run_config_of(r).learner.algorithm for r in runs}
  assert algorithms == {"sao": "sao", "gspo": "gspo", "grpo": "grpo"}
  assert s.expected_last_step(runs[0]) == 10 + 240 - 1 and s.expected_last_step(runs[-1]) == 239
  with pytest.raises(ValueError, match="unequal RL rollout budgets"):
    s.check_equal_budgets([runs[0], s.Run("short", runs[0].config, {"total_steps": 100})])
  assert s.load_analysis(s.sweep_path("toy_algorithms"))["reference"] == "sao"


def test_toy_matched_concurrency_matches_loops_and_engines():
  runs = s.load_sweep(s.sweep_path("toy_matched_concurrency"))
  assert len(runs) == 8
  for r in runs:
    c = s.run_config_of(r)
    loops = int(r.arm.split("loops")[1])
    assert (c.rollout.concurrency, c.num_workers, c.num_engines, c.total_steps) == (loops, 1, 1, 240)
    assert r.arm.split("-")[0] == c.learner.algorithm


def test_toy_ablations_change_exactly_one_factor():
  runs = s.load_sweep(s.sweep_path("toy_ablations"))
  assert len(runs) == 27
  arms = {r.arm for r in runs}
  assert arms == {"stabilized", *REFERENCE_KEYS_CHANGED}
  reference = _flat(s.run_config_of(next(r for r in runs if r.arm == "stabilized")))
  for r in runs:
    s.validate_run(r)
    if r.arm == "stabilized" or r.overrides["seed"] != 0:
      continue
    config = _flat(s.run_config_of(r))
    changed = {k: v for k, v in config.items() if v != reference[k]}
    assert changed == REFERENCE_KEYS_CHANGED[r.arm], r.arm


def test_tuple_override_parses_through_the_command_line():
  """`critic_attention`'s tuple override survives `--config.<key>=<value>` parsing (config_flags), as train.py
  gets it."""
  run = next(r for r in s.load_sweep(s.sweep_path("toy_ablations")) if r.name == "critic_attention-seed0")
  code = ("from absl import app\nfrom ml_collections import config_flags\nfrom absl import flags\n"
          "C = config_flags.DEFINE_config_file('config', None, '', lock_config=True)\n"
          "flags.DEFINE_string('workdir', '', '')\n"
          "app.run(lambda _: print(repr(C.value.learner.critic.frozen_params), C.value.learner.sao.lambda_policy))\n")
  out = subprocess.run([sys.executable, "-c", code, *run.command("/tmp/unused")[2:]], cwd=s.REPO_ROOT,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == "('.*visual.*',) 0.0"


def test_code_version_stamps(tmp_path):
  version = s.code_version()
  assert len(version.split("+")[0]) == 40
  s.stamp_code_version(str(tmp_path / "a"), version)
  assert s.read_code_version(str(tmp_path / "a")) == version
  s.stamp_code_version(str(tmp_path / "a"), version)  # the same version again (a resumed run) is fine
  with pytest.raises(ValueError, match="other versions"):
    s.stamp_code_version(str(tmp_path / "a"), "0" * 40)
  with pytest.raises(RuntimeError, match="git checkout"):
    s.code_version(str(tmp_path))


def test_launcher_stamps_runs_and_refuses_mixed_versions(tmp_path):
  fake = os.path.join(s.REPO_ROOT, "tests", "launch", "fake_train.py")

  def command(run, workdir):
    return [sys.executable, fake, f"--config={run.config}", *run_config.override_flags(run.overrides),
            f"--workdir={workdir}"]

  runs = [s.Run("a-seed0", "x.py:toy", {"seed": 0}, arm="a"), s.Run("a-seed3", "x.py:toy", {"seed": 3}, arm="a")]
  states = local.run_sweep(runs, str(tmp_path), command_fn=command, poll_s=0.02, out=io.StringIO())
  assert [st.status for st in states] == [local.DONE_STATUS] * 2
  version = s.code_version()
  assert all(s.read_code_version(st.workdir) == version for st in states)
  os.remove(os.path.join(states[1].workdir, local.DONE))  # to be resumed ...
  s.stamp_code_version(str(tmp_path / "a-seed0"), version)
  with open(os.path.join(str(tmp_path / "a-seed0"), s.VERSION_FILE), "w") as f:
    f.write('{"version": "' + "1" * 40 + '"}')  # ... but another run of the sweep was made by other code
  with pytest.raises(ValueError, match="other versions"):
    local.run_sweep(runs, str(tmp_path), command_fn=command, poll_s=0.02, out=io.StringIO())
  assert not os.path.isfile(os.path.join(states[1].workdir, local.DONE))  # nothing was started
