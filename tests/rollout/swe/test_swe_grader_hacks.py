"""The grade cannot be gamed through test infrastructure: each hack, applied as a model patch or played through
`SweEnv`, scores 0 (and with the real fix still scores 1), while gold patches keep scoring 1. The attacks of issue 43
are named by their number there."""
from __future__ import annotations

import asyncio
import importlib.util
import py_compile
import subprocess

import pytest

from sao.rollout.envs.swe import allow_list, dataset, generator, grader, snapshots, stats
from sao.rollout.envs.swe.sandbox import SandboxConfig
from sao.transport.trajectory import Status

from swe_fixtures import OPS_FIXED

CONFIG = SandboxConfig(timeout_s=30)
# A pytest hook that rewrites every test report to "passed".
ALL_PASS_HOOK = ("import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                 "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n")
FAKE_REPORT = ("PASSED tests/test_ops.py::test_clamp_high\nPASSED tests/test_ops.py::test_clamp_low\n"
               "PASSED tests/test_ops.py::test_clamp_mid\nPASSED tests/test_ops.py::test_double\n")
new = generator.unified_diff
# Makes every test function a no-op: patched from inside the process that runs the tests.
RUNTEST_PATCH = "import _pytest.python\n_pytest.python.Function.runtest = lambda self: None\n"


def _hacks() -> dict[str, str]:
  return {
      "top-level conftest": new("conftest.py", "", ALL_PASS_HOOK),
      "conftest beside the tests": new("tests/conftest.py", "", ALL_PASS_HOOK),
      "pytest.ini loads a plugin": new("pytest.ini", "", "[pytest]\naddopts = -p hackplug\n")
                                   + new("hackplug.py", "", ALL_PASS_HOOK),
      "pyproject addopts": new("pyproject.toml", "", "[tool.pytest.ini_options]\naddopts = \"-p hackplug\"\n")
                           + new("hackplug.py", "", ALL_PASS_HOOK),
      "tox.ini addopts": new("tox.ini", "", "[pytest]\naddopts = -p hackplug\n")
                         + new("hackplug.py", "", ALL_PASS_HOOK),
      "setup.cfg addopts": new("setup.cfg", "", "[tool:pytest]\naddopts = -p hackplug\n")
                           + new("hackplug.py", "", ALL_PASS_HOOK),
      # Attack 1: pytest 9 reads both names; the grader passes its own configuration with -c, and leaves them out.
      "pytest.toml loads a plugin": new("pytest.toml", "", "[pytest]\naddopts = [\"-p\", \"hackplug\"]\n")
                                    + new("hackplug.py", "", ALL_PASS_HOOK),
      ".pytest.toml loads a plugin": new(".pytest.toml", "", "[pytest]\naddopts = [\"-p\", \"hackplug\"]\n")
                                     + new("hackplug.py", "", ALL_PASS_HOOK),
      "pyproject [tool.pytest]": new("pyproject.toml", "", "[tool.pytest]\naddopts = [\"-p\", \"hackplug\"]\n")
                                 + new("hackplug.py", "", ALL_PASS_HOOK),
      # Attack 7: a test package's __init__ is test code, left out like the test files.
      "tests/__init__ patches Function.runtest": new("tests/__init__.py", "", RUNTEST_PATCH),
      "git metadata": new(".git/hooks/post-checkout", "", "#!/bin/sh\n") + new(".gitattributes", "", "* -text\n"),
      "sitecustomize": new("sitecustomize.py", "", "import builtins\nbuiltins.__sao_hack__ = 1\n"),
      "pth file": new("hack.pth", "", "import os\n"),
      # `python -m pytest` would run this file instead of pytest: it prints a passing -rA report.
      "shadowing pytest": new("pytest.py", "", f"print({FAKE_REPORT!r})\n"),
      # Printed after pytest's own summary, so a parser of the terminal output would read it last.
      "fake report at exit": new("calc/__init__.py", "",
                                 f"import atexit\natexit.register(print, {FAKE_REPORT!r})\n"),
  }


@pytest.fixture(scope="module")
def calc(calc_dataset):
  jsonl, root, _ = calc_dataset
  return dataset.load_jsonl(jsonl, root)[0]


def _grade_all(instance, patches: dict[str, str]) -> dict[str, grader.GradeResult]:
  async def run():
    results = await asyncio.gather(*(grader.agrade(instance, p, CONFIG) for p in patches.values()))
    return dict(zip(patches, results))
  return asyncio.run(run())


def test_infrastructure_hacks_score_zero_and_do_not_block_a_real_fix(calc):
  hacks = _hacks()
  results = _grade_all(calc, {**hacks, **{f"{name} + fix": patch + calc.patch for name, patch in hacks.items()}})
  for name in hacks:
    assert results[name].status == Status.OK and results[name].reward == 0.0, (name, results[name].detail)
    assert results[name].neutralised or name == "fake report at exit", name  # that one is source code
    assert results[f"{name} + fix"].reward == 1.0, (name, results[f"{name} + fix"].detail)


def test_unchecked_pyc_cannot_replace_the_source(calc, tmp_path):
  """A compiled module whose source stays buggy: Python would run the .pyc without checking its source."""
  repo = tmp_path / "repo"
  subprocess.run(["git", "clone", "-q", snapshots.git_source(calc.snapshot), str(repo)], check=True)
  subprocess.run(["git", "-C", str(repo), "checkout", "-q", calc.base_commit], check=True)
  fixed = tmp_path / "ops.py"
  fixed.write_text(OPS_FIXED)
  tag = importlib.util.cache_from_source("calc/ops.py").split("/")[-1]
  py_compile.compile(str(fixed), cfile=str(repo / "calc" / "__pycache__" / tag),
                     invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
  subprocess.run(["git", "-C", str(repo), "add", "-A", "-f"], check=True)
  patch = subprocess.run(["git", "-C", str(repo), "diff", "--cached", "--binary"], check=True, capture_output=True,
                         text=True).stdout
  assert "__pycache__" in patch
  result = grader.grade(calc, patch, CONFIG)
  assert result.status == Status.OK and result.reward == 0.0, result.detail


def test_classification_of_changed_paths():
  prefixes = allow_list.plugin_prefixes({"tests.helpers", "shipped_plugin"},
                                        {"tests/helpers.py", "src/shipped_plugin/__init__.py", "tests/conftest.py"})
  assert set(prefixes) == {"tests/helpers.py", "src/shipped_plugin"}
  tree = {"pkg/__init__.py", "pkg/json/__init__.py", "_pytest/__init__.py", "pluggy/__init__.py"}
  not_source = ["conftest.py", "a/b/conftest.py", "pytest.ini", "pytest.toml", ".pytest.toml", "sub/tox.ini",
                "setup.cfg", "pyproject.toml", "sitecustomize.py", "lib/usercustomize.py", "x.pth", "tests/test_a.py",
                "tests/a_test.py", "tests/__init__.py", "pkg/tests/data.txt", "test/data.txt",
                "pkg/__pycache__/m.cpython-311.pyc", "json.py", "tests/json.py", "pytest.py", "_pytest/main.py",
                "pluggy/__init__.py", "tests/helpers.py", "src/shipped_plugin/hooks.py", ".git/config",
                ".gitattributes", "../outside.py", "/etc/passwd", "a//b.py", "a/./b.py"]
  source = ["pkg/core.py", "pkg/json/__init__.py", "pkg/json/decoder.py", "README.md", "docs/conf.py",
            "json.txt", "src/pkg/testing_utils.py", "setup.py"]
  for path in not_source:
    assert allow_list.not_source(path, prefixes, tree), path
  for path in source:
    assert not allow_list.not_source(path, prefixes, tree), path
  # Installed third-party modules too (numpy is installed here), unless the snapshot itself provides the module.
  shadowed = allow_list.shadowable({"calc/__init__.py"})
  assert allow_list.not_source("numpy.py", prefixes, tree, shadowed) == "shadows an installed module"
  assert allow_list.not_source("numpy/__init__.py", prefixes, tree | {"numpy/__init__.py"}, shadowed)
  own = allow_list.shadowable({"numpy/__init__.py", "numpy/core.py"})
  assert not allow_list.not_source("numpy/core.py", prefixes, tree | {"numpy/__init__.py"}, own)
  assert not allow_list.not_source("calc/numpy.py", prefixes, tree | {"calc/__init__.py"}, shadowed)


def test_gold_patches_of_generated_instances_still_resolve():
  """`stats --verify` on a sample of the generated dataset: no patch scores 0, the gold patch scores 1."""
  instances = [generator.instance(i) for i in (0, 1, 2)]
  assert asyncio.run(stats.averify(instances, CONFIG, concurrency=3)) == []
