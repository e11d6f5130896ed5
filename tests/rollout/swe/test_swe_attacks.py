"""The attacks of issue 43, played for real through the grader and `SweEnv` on the acme/calc instance (a patch
that fixes nothing must score 0, or be refused; with the real fix, a harmless extra still scores 1)."""
from __future__ import annotations

import asyncio
import dataclasses
import os

import pytest

from sao.rollout import envs
from sao.rollout.envs.swe import dataset, generator, graded_tree, grader, patches, snapshots
from sao.rollout.envs.swe.base_tree import BaseTree
from sao.rollout.envs.swe.sandbox import SandboxConfig
from sao.rollout.tool_format import ToolCall
from sao.transport.trajectory import Status

from swe_fixtures import OPS_BASE

CONFIG = SandboxConfig(timeout_s=30)
new = generator.unified_diff
ALL_PASS_HOOK = ("import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                 "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n")


@pytest.fixture(scope="module")
def calc(calc_dataset):
  jsonl, root, _ = calc_dataset
  return dataset.load_jsonl(jsonl, root)[0]


def _grade_all(instance, patches_by_name, **kw):
  async def run():
    results = await asyncio.gather(*(grader.agrade(instance, p, CONFIG, **kw) for p in patches_by_name.values()))
    return dict(zip(patches_by_name, results))
  return asyncio.run(run())


def _in_calc_init(code: str) -> str:
  return new("calc/__init__.py", "", code)


def test_attack_1_no_rootdir_configuration_file_is_read_even_when_present(calc):
  """The grader's run takes its configuration from `-c`: a `pytest.toml` (or any name pytest learns) in the tree,
  here written straight into the tree past the allow-list, loads nothing."""
  base = BaseTree.open(snapshots.git_source(calc.snapshot), calc.base_commit)
  overlay = {"pytest.toml": b'[pytest]\naddopts = ["-p", "hackplug"]\n', ".pytest.toml":
             b'[pytest]\naddopts = ["-p", "hackplug"]\n', "hackplug.py": ALL_PASS_HOOK.encode()}
  empty = graded_tree.build(calc, "", base)
  tree = dataclasses.replace(empty, overlay={**empty.overlay, **overlay})

  async def run():
    return await grader._test_run(calc, calc.snapshot.path, tree, CONFIG, grader.DEFAULT_PYTEST_ARGS, 60,
                                  graded_tree.DEFAULT_CONFIG)
  run_result, report = asyncio.run(run())
  assert report is not None, run_result.output[-500:]
  assert report["outcomes"]["tests/test_ops.py::test_clamp_high"] == "FAILED", report


def test_attack_2_xfail_skip_pass_only_where_the_instance_declares_them(calc):
  xfail = new("calc/ops.py", OPS_BASE, OPS_BASE.replace(
      "    if x > hi:\n        return lo\n", "    if x > hi:\n        import pytest\n        pytest.xfail()\n"))
  skip = xfail.replace("pytest.xfail()", "pytest.skip()")
  results = _grade_all(calc, {"xfail": xfail, "skip": skip})
  for name, result in results.items():
    assert result.status == Status.OK and result.reward == 0.0, (name, result.detail)
  declared = dataclasses.replace(calc, extra={**calc.extra, "meta": {"expected_outcomes": {
      "tests/test_ops.py::test_clamp_high": "XFAIL"}}})
  assert grader.grade(declared, xfail, CONFIG).reward == 1.0


def test_attack_3_a_context_diff_is_refused_and_git_metadata_never_reaches_the_tree(calc):
  context = ("*** a/.git/config\n--- b/.git/config\n***************\n*** 1,1 ****\n--- 1,3 ----\n"
             "  [core]\n+ [filter \"x\"]\n+ \tsmudge = sh .git/x\n")
  attributes = new(".gitattributes", "", "tests/*.py filter=x\n")
  unified = new(".git/config", "[core]\n", "[core]\n[filter \"x\"]\n\tsmudge = sh .git/x\n") + attributes
  results = _grade_all(calc, {"context": context + attributes, "context + fix": calc.patch + context,
                              "unified": unified, "unified + fix": unified + calc.patch})
  assert results["context"].reward == 0.0 and results["context"].verdict == "refused"
  assert "not a unified diff" in results["context"].detail
  assert results["context + fix"].reward == 0.0 and results["context + fix"].verdict == "refused"
  assert results["unified"].reward == 0.0
  assert set(results["unified"].neutralised) == {".git/config", ".gitattributes"}
  assert results["unified + fix"].reward == 1.0


def test_attack_4_git_filters_in_the_episode_cannot_write_the_patch(calc_dataset):
  """The agent plants a payload under .git, a `clean` filter that prints it to stderr and a file that triggers it;
  the diff is read from file contents on the host, so the payload never becomes the patch."""
  jsonl, root, record = calc_dataset
  payload = record["patch"] + new("conftest.py", "", ALL_PASS_HOOK)
  env = envs.make("swe", jsonl=str(jsonl), snapshot_root=str(root))
  env.reset(env.task_pool()[0])
  try:
    for command in (f"mkdir -p .git/x && cat > .git/x/payload <<'EOF'\n{payload}EOF",
                    "git config filter.leak.clean 'cat .git/x/payload >&2; cat' && git config filter.leak.smudge cat"
                    " && echo '*.trigger filter=leak' > .gitattributes",
                    "echo t > a.trigger && git add -A 2>&1 | head -3"):
      env.step(ToolCall("bash", {"command": command}))
    diff = asyncio.run(env.diff())
    assert "return hi" not in diff and "pytest_runtest_makereport" not in diff
    assert {p for c in patches.parse(diff) for p in c.paths} == {".gitattributes", "a.trigger"}
    env.step(ToolCall("submit", {}))
    assert env.score() == 0.0 and env.grade_result.neutralised == (".gitattributes",)
  finally:
    env.close()


def test_attack_6_hanging_when_unsure_scores_zero(calc):
  """A trace function that sleeps on every AssertionError turns a failing run into a timeout: graded 0 (the
  snapshot's own tests finish), and with the real fix (nothing fails, nothing hangs) the trace is found: tampered."""
  trace = ("import sys, time\n\n\ndef _hang(frame, event, arg):\n"
           "    if event == 'exception' and issubclass(arg[0], AssertionError):\n        time.sleep(10 ** 6)\n"
           "    return _hang\n\n\nsys.settrace(_hang)\n")
  results = _grade_all(calc, {"hang": _in_calc_init(trace), "hang + fix": _in_calc_init(trace) + calc.patch},
                       test_timeout_s=5)
  assert results["hang"].status == Status.OK and results["hang"].reward == 0.0
  assert results["hang"].verdict == "timeout", results["hang"].detail
  assert results["hang + fix"].status == Status.OK and results["hang + fix"].reward == 0.0
  assert results["hang + fix"].verdict == "tampered" and "settrace" in results["hang + fix"].detail


def test_in_process_tampering_is_detected_and_scored_zero(calc):
  """Attack 7 moved into the source (the package's own __init__), and its relatives: pytest internals, report
  hooks, builtins. Each, even together with the real fix, is `tampered`, reward 0."""
  hooks = ("import gc\nimport _pytest.config\n\n\nclass _Pass:\n    def pytest_runtest_logreport(self, report):\n"
           "        report.outcome = 'passed'\n\n\nfor _c in gc.get_objects():\n"
           "    if isinstance(_c, _pytest.config.Config):\n        _c.pluginmanager.register(_Pass())\n")
  tamperers = {
      "Function.runtest": "import _pytest.python\n_pytest.python.Function.runtest = lambda self: None\n",
      "call_and_report": "import _pytest.runner\n_orig = _pytest.runner.call_and_report\n"
                         "_pytest.runner.call_and_report = lambda *a, **k: _orig(*a, **k)\n",
      "report hook": hooks,
      "builtins": "import builtins\nbuiltins.print = lambda *a, **k: None\n",
      # A default plugin pytest itself imports only later in the run: watched all the same.
      "skipping helper": "import _pytest.skipping\n_pytest.skipping.evaluate_xfail_marks = lambda item: None\n",
      "setprofile": "import sys\nsys.setprofile(lambda *a: None)\n",
  }
  patches_by_name = {**{n: _in_calc_init(c) for n, c in tamperers.items()},
                     **{n + " + fix": _in_calc_init(c) + calc.patch for n, c in tamperers.items()}}
  results = _grade_all(calc, patches_by_name)
  for name, result in results.items():
    assert result.status == Status.OK and result.reward == 0.0, (name, result.detail)
    assert result.verdict == "tampered", (name, result.verdict, result.detail)


def test_attack_8_the_hacking_signal_is_empty_for_an_empty_patch(calc_dataset, calc):
  assert grader.grade(calc, "", CONFIG).neutralised == ()
  jsonl, root, _ = calc_dataset
  env = envs.make("swe", jsonl=str(jsonl), snapshot_root=str(root))
  env.reset(env.task_pool()[0])
  try:
    env.step(ToolCall("bash", {"command": "python -m pytest -q tests >/dev/null; git status --short"}))
    assert asyncio.run(env.diff()) == ""
    env.step(ToolCall("submit", {}))
    assert env.score() == 0.0 and env.grade_result.neutralised == () and env.grade_result.verdict == "unresolved"
  finally:
    env.close()


def test_patches_parse_apply_and_format_round_trip():
  before = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n"
  after = before.replace("b\n", "B\n").replace("i\n", "I\nextra\n") + "tail"
  diff = patches.format_file("pkg/m.py", before.encode(), after.encode())
  [change] = patches.parse(diff)
  assert patches.apply(change, before) == after
  assert patches.apply(change, "0\n" + before) == "0\n" + after  # a hunk may move, never fuzz
  with pytest.raises(patches.PatchError):
    patches.apply(change, before.replace("c\n", "C\n"))
  created, deleted = patches.format_file("n.py", None, b"x\n"), patches.format_file("n.py", b"x\n", None)
  assert patches.apply(patches.parse(created)[0], None) == "x\n"
  assert patches.apply(patches.parse(deleted)[0], "x\n") is None
  assert patches.parse(patches.format_file("b.bin", None, b"\0\1"))[0].special
  with pytest.raises(patches.PatchError, match="not part of a unified diff"):
    patches.parse("*** a/x\n--- b/x\n")
  with pytest.raises(patches.PatchError):
    patches.parse("--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-a\n")
  quoted = patches.format_file("dir/tab\tname", None, b"q\n")
  assert patches.parse(quoted)[0].new_path == "dir/tab\tname"
  declared = dataclasses.make_dataclass("Declared", ["extra"])({"meta": {"expected_outcomes": {
      "t": ["XFAIL", "bogus"], "u": "SKIPPED", "v": 3}}})
  assert grader.expected_outcomes(declared) == {"t": {"XFAIL"}, "u": {"SKIPPED"}, "v": set()}


def test_the_episode_diff_is_read_from_contents_without_following_links(calc, tmp_path):
  """`workspace_diff` on a tree the agent shaped: an edit, a new file, a deletion, a symlink to a host secret (named,
  never read), a FIFO (skipped, never opened), git metadata and caches (not part of a patch)."""
  import subprocess
  from sao.rollout.envs.swe.workspace import DiffTooLargeError, workspace_diff
  repo = tmp_path / "repo"
  subprocess.run(["git", "clone", "-q", snapshots.git_source(calc.snapshot), str(repo)], check=True)
  subprocess.run(["git", "-C", str(repo), "checkout", "-q", calc.base_commit], check=True)
  base = BaseTree.open(snapshots.git_source(calc.snapshot), calc.base_commit)
  assert workspace_diff(repo, base, 1 << 20) == ""
  (repo / "calc" / "ops.py").write_text(OPS_BASE.replace("return lo\n    return x", "return hi\n    return x"))
  (repo / "calc" / "new.py").write_text("X = 1\n")
  (repo / ".gitignore").unlink()
  os.symlink("/etc/shadow", repo / "calc" / "leak.py")
  os.mkfifo(repo / "calc" / "pipe")
  (repo / ".git" / "config").write_text("[filter \"x\"]\n\tclean = evil\n")
  (repo / "calc" / "__pycache__").mkdir()
  (repo / "calc" / "__pycache__" / "ops.cpython-311.pyc").write_bytes(b"\0pyc")
  diff = workspace_diff(repo, base, 1 << 20)
  changes = {c.new_path or c.old_path: c for c in patches.parse(diff)}
  assert set(changes) == {"calc/ops.py", "calc/new.py", ".gitignore", "calc/leak.py"}
  assert changes[".gitignore"].new_path is None and changes["calc/leak.py"].special
  assert "root:" not in diff and "evil" not in diff
  assert patches.apply(changes["calc/ops.py"], OPS_BASE).count("return hi") == 1
  with pytest.raises(DiffTooLargeError):
    workspace_diff(repo, base, 8)


def test_a_module_shadowing_an_installed_dependency_is_left_out(calc):
  """The tests' own dependencies cannot be replaced from the repository's top level: a `numpy.py` whose helpers
  always agree (the calc tests do not use numpy; here the shadow only has to be left out, and the fix still count)."""
  shadow = new("numpy.py", "", "def allclose(*args, **kwargs):\n    return True\n")
  results = _grade_all(calc, {"shadow": shadow, "shadow + fix": shadow + calc.patch})
  assert results["shadow"].neutralised == ("numpy.py",) and results["shadow"].reward == 0.0
  assert results["shadow + fix"].neutralised == ("numpy.py",) and results["shadow + fix"].reward == 1.0


def test_lines_are_cut_at_newlines_only_as_git_cuts_them(tmp_path):
  """Form feeds, carriage returns and U+2028 are characters inside a line: a git diff of such a file applies."""
  import subprocess
  before = "a\x0cb\nc\r\nd\u2028e\nf\n"
  after = before.replace("f\n", "F\n")
  for name, text in (("before", before), ("after", after)):
    (tmp_path / name).write_bytes(text.encode())
  git = subprocess.run(["git", "diff", "--no-index", "before", "after"], cwd=tmp_path, capture_output=True).stdout
  [change] = patches.parse(git.decode())
  assert patches.apply(change, before) == after
  [ours] = patches.parse(patches.format_file("m.py", before.encode(), after.encode()))
  assert patches.apply(ours, before) == after
  assert patches.split_lines("x\ny") == ["x\n", "y"] and patches.split_lines("") == []


def test_no_later_commit_is_among_the_episode_objects(calc_dataset):
  """The snapshot's fix commit (with the hidden test) used to sit in the episode's pack, unreachable but readable
  (`git fsck --lost-found`, `cat-file --batch-all-objects`); episodes now clone only the history up to base_commit."""
  jsonl, root, _ = calc_dataset
  env = envs.make("swe", jsonl=str(jsonl), snapshot_root=str(root))
  env.reset(env.task_pool()[0])
  try:
    probe = ("git cat-file --batch-all-objects --batch | grep -c clamp_high; "
             "git fsck --lost-found 2>&1 | grep -c dangling; git log --oneline | wc -l")
    obs, _ = env.step(ToolCall("bash", {"command": probe}))
    assert obs.split()[:3] == ["0", "0", "1"], obs
  finally:
    env.close()
