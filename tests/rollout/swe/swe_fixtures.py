"""Helpers of the SWE environment tests: a small local repository with a SWE-bench instance over it."""
from __future__ import annotations

import json
import pathlib
import subprocess

from sao.rollout.envs.swe import sandbox as sandbox_lib

OPS_BASE = '''def clamp(x, lo, hi):
    """x limited to [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return lo
    return x


def double(x):
    return 2 * x
'''
OPS_FIXED = OPS_BASE.replace("        return lo\n    return x", "        return hi\n    return x")
TESTS_BASE = '''from calc.ops import clamp, double


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_mid():
    assert clamp(5, 0, 10) == 5


def test_double():
    assert double(4) == 8
'''
TESTS_NEW = TESTS_BASE + '''

def test_clamp_high():
    assert clamp(50, 0, 10) == 10
'''


def _git(repo, *args, input=None):
  return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, input=input,
                        env=sandbox_lib._git_env()).stdout


def make_calc_repo(root: pathlib.Path) -> dict:
  """Creates `root/acme__calc` (a git repo: base commit, then the fix commit) and returns the SWE-bench record."""
  repo = root / "acme__calc"
  (repo / "calc").mkdir(parents=True)
  (repo / "tests").mkdir()
  (repo / "calc" / "__init__.py").write_text("")
  (repo / "calc" / "ops.py").write_text(OPS_BASE)
  (repo / "tests" / "test_ops.py").write_text(TESTS_BASE)
  (repo / ".gitignore").write_text("__pycache__/\n")
  _git(repo, "init", "-q", "-b", "main")
  _git(repo, "add", "-A")
  _git(repo, "commit", "-qm", "base")
  base = _git(repo, "rev-parse", "HEAD").strip()
  (repo / "calc" / "ops.py").write_text(OPS_FIXED)
  patch = _git(repo, "diff")
  (repo / "tests" / "test_ops.py").write_text(TESTS_NEW)
  test_patch = _git(repo, "diff", "--", "tests")
  _git(repo, "commit", "-qam", "fix clamp above the range")  # history after base_commit: must stay hidden
  return {
      "instance_id": "acme__calc-1", "repo": "acme/calc", "base_commit": base, "patch": patch,
      "test_patch": test_patch, "problem_statement": "clamp(50, 0, 10) returns 0 instead of 10.",
      "hints_text": "", "created_at": "2024-01-01T00:00:00Z", "version": "0.1",
      "environment_setup_commit": base,
      # As on the Hugging Face hub: test-id lists serialised as JSON strings.
      "FAIL_TO_PASS": json.dumps(["tests/test_ops.py::test_clamp_high"]),
      "PASS_TO_PASS": json.dumps(["tests/test_ops.py::test_clamp_low", "tests/test_ops.py::test_clamp_mid",
                                  "tests/test_ops.py::test_double"]),
  }

