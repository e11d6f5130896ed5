"""SWE-bench-style grading on known-good and known-bad patches, void grades, and a real SWE-bench JSONL end to end."""
from __future__ import annotations

import dataclasses
import json

import pytest

from sao.rollout import envs
from sao.rollout.envs.swe import dataset, generator, grader
from sao.rollout.envs.swe.sandbox import SandboxConfig
from sao.transport.trajectory import Status

from swe_fixtures import OPS_BASE, OPS_FIXED, TESTS_BASE

CONFIG = SandboxConfig(timeout_s=30)


@pytest.fixture(scope="module")
def calc(calc_dataset):
  jsonl, root, _ = calc_dataset
  return dataset.load_jsonl(jsonl, root)[0]


def test_gold_patch_resolves(calc):
  result = grader.grade(calc, calc.patch, CONFIG)
  assert result.status == Status.OK and result.reward == 1.0 and result.resolved
  assert all(result.tests.values()) and set(result.tests) == set(calc.fail_to_pass + calc.pass_to_pass)


def test_empty_patch_fails_only_fail_to_pass(calc):
  result = grader.grade(calc, "", CONFIG)
  assert result.status == Status.OK and result.reward == 0.0
  assert not any(result.tests[t] for t in calc.fail_to_pass) and all(result.tests[t] for t in calc.pass_to_pass)


def test_wrong_fix_and_broken_pass_to_pass_score_zero(calc):
  wrong = generator.unified_diff("calc/ops.py", OPS_BASE, OPS_BASE.replace("        return lo\n    return x",
                                                                           "        return x\n    return x"))
  assert grader.grade(calc, wrong, CONFIG).reward == 0.0
  # Fixes the issue but breaks double(): a PASS_TO_PASS test fails.
  breaks = generator.unified_diff("calc/ops.py", OPS_BASE, OPS_FIXED.replace("return 2 * x", "return 3 * x"))
  result = grader.grade(calc, breaks, CONFIG)
  assert result.reward == 0.0 and result.tests["tests/test_ops.py::test_clamp_high"]
  assert not result.tests["tests/test_ops.py::test_double"]


def test_patch_that_does_not_apply_scores_zero(calc):
  result = grader.grade(calc, "diff --git a/calc/ops.py b/calc/ops.py\n--- a/calc/ops.py\n+++ b/calc/ops.py\n"
                              "@@ -1,1 +1,1 @@\n-no such line\n+x\n", CONFIG)
  assert result.status == Status.OK and result.reward == 0.0 and not result.patch_applied


def test_edits_to_test_files_are_overridden(calc):
  # Deleting the failing test (instead of fixing the bug) does not help: the test patch's files are reset first.
  tamper = generator.unified_diff("tests/test_ops.py", TESTS_BASE, TESTS_BASE.replace(
      "def test_clamp_mid():\n    assert clamp(5, 0, 10) == 5\n", "def test_clamp_mid():\n    assert True\n"))
  assert grader.grade(calc, tamper, CONFIG).reward == 0.0
  assert grader.grade(calc, tamper + calc.patch, CONFIG).reward == 1.0


def test_a_patch_that_hangs_scores_zero_but_a_hanging_snapshot_voids_the_grade(calc):
  hang = generator.unified_diff("calc/ops.py", OPS_BASE, OPS_FIXED.replace(
      "def double(x):\n", "def double(x):\n    while True:\n        pass\n"))
  # 5 s: the snapshot's own tests (≈ 0.5 s alone) run against the same limit, and exceeded 2 s on a loaded machine.
  result = grader.grade(calc, hang, CONFIG, test_timeout_s=5)
  assert result.status == Status.OK and result.reward == 0.0 and result.verdict == "timeout", result.detail
  # The snapshot's own tests hang (here: a hidden test that loops): not the patch's doing, so void.
  hanging_tests = dataclasses.replace(calc, test_patch=calc.test_patch.replace(
      "+    assert clamp(50, 0, 10) == 10", "+    while True:\n+        pass").replace("+11,7 @@", "+11,8 @@"))
  for patch in (calc.patch, ""):
    result = grader.grade(hanging_tests, patch, CONFIG, test_timeout_s=5)
    assert result.status == Status.TIMEOUT and result.reward == 0.0 and result.verdict == "void", result.detail


def test_setup_failure_voids_the_grade(calc):
  missing = dataclasses.replace(calc, snapshot=dataset.Snapshot("dir", "/nonexistent/repo"))
  result = grader.grade(missing, calc.patch, CONFIG)
  assert result.status == Status.ENV_ERROR and "setup failed" in result.detail
  bad_test_patch = dataclasses.replace(calc, test_patch=calc.test_patch.replace("double(4) == 8", "zzz"))
  assert grader.grade(bad_test_patch, calc.patch, CONFIG).status == Status.ENV_ERROR


def test_real_swe_bench_jsonl_from_bundle_loads_grades_and_plays(calc_dataset, tmp_path):
  """The acceptance path: a SWE-bench JSONL + a git bundle; the gold patch grades 1, the expert resolves it."""
  import subprocess
  _, root, record = calc_dataset
  subprocess.run(["git", "-C", str(root / "acme__calc"), "bundle", "create", str(tmp_path / "acme__calc.bundle"),
                  "--all"], check=True, capture_output=True)
  jsonl = tmp_path / "swe.jsonl"
  jsonl.write_text(json.dumps(record) + "\n")
  [instance] = dataset.load_jsonl(jsonl, tmp_path)
  assert instance.snapshot.kind == "bundle"
  assert grader.grade(instance, instance.patch, CONFIG).reward == 1.0
  env = envs.make("swe", jsonl=str(jsonl), snapshot_root=str(tmp_path))
  demo = env.demonstrate(env.task_pool()[0], rng=None)
  env.close()
  assert demo.reward == 1.0 and demo.calls[-1].name == "submit"


def test_report_outcome_words_follow_pytest_summary():
  from types import SimpleNamespace as Report

  from sao.rollout.envs.swe import pytest_report

  def report(when, outcome, xfail=False, nodeid="t.py::x"):
    r = Report(when=when, nodeid=nodeid, passed=outcome == "passed", skipped=outcome == "skipped",
               failed=outcome == "failed")
    if xfail:
      r.wasxfail = ""
    return r

  word = pytest_report.outcome_word
  assert word(report("call", "passed")) == "PASSED" and word(report("call", "failed")) == "FAILED"
  assert word(report("call", "skipped", xfail=True)) == "XFAIL" and word(report("call", "passed", True)) == "XPASS"
  assert word(report("setup", "failed")) == "ERROR" and word(report("setup", "skipped")) == "SKIPPED"
  assert word(report("teardown", "passed")) == "" and word(report("teardown", "failed")) == "ERROR"
  recorder = pytest_report.Recorder()
  for r in (report("setup", "passed"), report("call", "passed"), report("teardown", "failed")):
    recorder.pytest_runtest_logreport(r)
  assert recorder.outcomes == {"t.py::x": "ERROR"}  # a failing teardown fails the test, as in -rA
