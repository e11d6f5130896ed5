"""The generated SWE dataset: small Python repositories, each with one planted bug, as SWE-bench instances.

Repository `i` (0 <= i < `MAX_REPOS`) is a pure function of `i` and `VERSION`: a package of three modules from
`library` with per-repository constants, a pytest suite, and one planted bug in one module. The tests the
bug breaks are found by running every test case in-process on the correct and on the buggy module (trusted code:
the library's own) — they become FAIL_TO_PASS and go into `test_patch` (so the bug went unnoticed at
`base_commit`, as in a real repository), every other test is PASS_TO_PASS. The problem statement is an issue report
written from one failing case (call, expected and actual result, a reproduction snippet). Tasks also carry the
fix for the scripted expert (`task["expert"]`), which the model never sees.

Nothing is written until an episode needs a repository: `materialize` creates its git repository once in the cache
(`$SAO_CACHE_DIR/swe/generated/v<VERSION>/`), and the commit is deterministic (fixed author, dates and message), so
`base_commit` is computed up front in pure Python and checked against git's own hash when materializing.
`write_dataset(out_dir, n)` exports the first `n` repositories as a plain SWE-bench JSONL plus git directories.
"""
from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import hashlib
import itertools
import pathlib
import random
import re
import shutil
import string
import subprocess
import tempfile
import threading
from typing import Any

from sao.rollout.envs.base import split_of
from sao.rollout.envs.swe import bwrap
from sao.rollout.envs.swe import dataset as dataset_lib
from sao.rollout.envs.swe import issues
from sao.rollout.envs.swe import sandbox as sandbox_lib
from sao.rollout.envs.swe.library import LIBRARY, Bug, Case, ModuleTemplate

VERSION = 1
MODULES_PER_REPO = 3
COMMIT_MESSAGE = "Initial import\n"

_OWNERS = ("acme", "octolabs", "bytewise", "northwind", "pyforge", "tinycorp", "openfield", "lambda-works",
           "greenleaf", "bluepeak", "redwood-io", "quanta")
_PROJECTS = ("tally", "ledger", "beacon", "quill", "sprocket", "harbor", "lantern", "meadow", "pebble", "orbit",
             "canvas", "thicket", "saffron", "juniper", "cobalt", "fjord", "marble", "nimbus", "parcel", "ripple",
             "summit", "tundra", "velvet", "willow", "zephyr", "anchor", "bramble", "cinder", "dynamo", "ember",
             "falcon", "garnet", "hollow", "indigo", "jasper", "kettle", "lumen", "mosaic", "nectar", "onyx")
_NAMES = [f"{o}/{p}" for o, p in itertools.product(_OWNERS, _PROJECTS)]
random.Random(f"sao-swe-names-{VERSION}").shuffle(_NAMES)
MAX_REPOS = len(_NAMES)
_BUG_SLOTS = [(m, b) for m, module in enumerate(LIBRARY) for b in range(len(module.bugs))]
random.Random(f"sao-swe-bugs-{VERSION}").shuffle(_BUG_SLOTS)
_MATERIALIZE_LOCK = threading.Lock()


class GeneratorError(RuntimeError):
  """The library produced an unusable repository (a bug that breaks no test, a snippet that is not unique...)."""


@dataclasses.dataclass(frozen=True)
class RepoSpec:
  """Everything about generated repository `index` (files at base_commit, the instance fields, the expert's fix)."""
  index: int
  repo: str
  package: str
  files: dict[str, str]
  instance: dict[str, Any]
  expert: dict[str, str]
  bug_kind: str
  bug_module: str
  modules: tuple[str, ...]


def _substitute(text: str, params: dict[str, Any]) -> str:
  return string.Template(text).substitute(params)


def _params(module: ModuleTemplate, rng: random.Random) -> dict[str, Any]:
  out = {}
  for name, values in module.params.items():
    value = rng.choice(values)
    out[name] = value
    out[f"{name}_ALT"] = rng.choice([v for v in values if v != value])
  return out


def _run_case(namespace: dict[str, Any], case: Case) -> tuple[str, Any]:
  """("value", v) or ("raises", exception) for `case` against a module's namespace."""
  local = dict(namespace)
  try:
    if case.setup:
      exec("\n".join(case.setup), local)  # noqa: S102 — the library's own trusted test code
    return "value", eval(case.expr, local)  # noqa: S307
  except Exception as e:  # noqa: BLE001 — an exception is an outcome here
    return "raises", e


def _module_namespace(source: str, where: str) -> dict[str, Any]:
  namespace: dict[str, Any] = {"__name__": where}
  exec(compile(source, where, "exec"), namespace)  # noqa: S102 — trusted library code
  return namespace


def _evaluate(module: ModuleTemplate, correct: str, buggy: str, where: str) -> tuple[dict[str, Any], list[Case]]:
  """Expected values of every case (raising GeneratorError if the correct module fails one) and the failing cases."""
  good, bad = _module_namespace(correct, where), _module_namespace(buggy, where + " (buggy)")
  expected, failing = {}, []
  for case in module.cases:
    kind, value = _run_case(good, case)
    if case.raises:
      if kind != "raises" or type(value).__name__ != case.raises:
        raise GeneratorError(f"{where}: case {case.name} should raise {case.raises}, got {kind} {value!r}")
    else:
      if kind == "raises":
        raise GeneratorError(f"{where}: case {case.name} raised {value!r} on the correct module")
      if eval(repr(value)) != value:  # noqa: S307 — the expected value is written into the test as a literal
        raise GeneratorError(f"{where}: case {case.name} has no literal repr: {value!r}")
      expected[case.name] = value
    bkind, bvalue = _run_case(bad, case)
    if case.raises:
      passes = bkind == "raises" and isinstance(bvalue, getattr(builtins, case.raises))
    else:
      passes = bkind == "value" and bvalue == expected[case.name]
    if not passes:
      failing.append(case)
  return expected, failing


def _render_case(case: Case, expected: dict[str, Any]) -> str:
  lines = [f"def test_{case.name}():"] + [f"    {line}" for line in case.setup]
  if case.raises:
    lines += [f"    with pytest.raises({case.raises}):", f"        {case.expr}"]
  else:
    lines.append(f"    assert {case.expr} == {expected[case.name]!r}")
  return "\n".join(lines) + "\n"


def _render_tests(package: str, module: str, source: str, cases: list[Case], expected: dict[str, Any]) -> str:
  names = [n.name for n in ast.parse(source).body
           if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_")]
  header = f"import pytest\n\nfrom {package}.{module} import {', '.join(names)}\n"
  return header + "".join("\n\n" + _render_case(c, expected) for c in cases)


def unified_diff(path: str, before: str, after: str) -> str:
  """A `git apply`-able diff of one text file (both versions end with a newline)."""
  import difflib
  body = "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{path}", f"b/{path}"))
  return f"diff --git a/{path} b/{path}\n{body}" if body else ""


def _expert_fix(correct: str, buggy: str, bug: Bug, params: dict[str, Any], where: str) -> tuple[str, str]:
  """(old_str, new_str): whole lines around the bug in the buggy file, unique there, and their correct version."""
  bad_snippet, good_snippet = _substitute(bug.buggy, params), _substitute(bug.correct, params)
  pos = correct.index(good_snippet)  # the same offset in both files: the text before the bug is identical
  start = correct.rfind("\n", 0, pos) + 1
  if bad_snippet:
    bad_end = pos + len(bad_snippet)
    end = bad_end if bad_snippet.endswith("\n") else (buggy.find("\n", bad_end) + 1 or len(buggy))
  else:  # a deleted block (whole lines): anchor the edit on the line before it
    end = pos
    start = correct.rfind("\n", 0, max(pos - 1, 0)) + 1
  while buggy.count(buggy[start:end]) != 1:
    if start == 0:
      raise GeneratorError(f"{where}: cannot find a unique context for the fix")
    start = correct.rfind("\n", 0, start - 1) + 1
  old = buggy[start:end]
  new = correct[start:len(correct) - (len(buggy) - end)]
  if buggy[:start] + new + buggy[end:] != correct:
    raise GeneratorError(f"{where}: the expert's fix does not restore the module")
  return old, new


@functools.lru_cache(maxsize=None)
def spec(index: int) -> RepoSpec:
  """Generated repository `index` (deterministic)."""
  if not 0 <= index < MAX_REPOS:
    raise ValueError(f"index: must be in [0, {MAX_REPOS}), got {index}")
  rng = random.Random(f"sao-swe-{VERSION}-{index}")
  repo = _NAMES[index]
  project = repo.split("/")[1]
  package = project.replace("-", "_")
  bug_m, bug_b = _BUG_SLOTS[index % len(_BUG_SLOTS)]
  others = rng.sample([m for m in range(len(LIBRARY)) if m != bug_m], MODULES_PER_REPO - 1)
  module_ids = sorted([bug_m] + others, key=lambda m: LIBRARY[m].name)
  version = f"0.{rng.randint(1, 9)}.{rng.randint(0, 12)}"
  files = {".gitignore": "__pycache__/\n*.pyc\n.pytest_cache/\n",
           "pyproject.toml": (f'[project]\nname = "{project}"\nversion = "{version}"\nrequires-python = ">=3.9"\n\n'
                              '[tool.pytest.ini_options]\ntestpaths = ["tests"]\n'),
           f"{package}/__init__.py": f'"""{project}: small utilities."""\n\n__version__ = "{version}"\n'}
  readme = [f"# {project}\n", f"Utilities of the {project} project.\n", "Modules:\n"]
  for m in module_ids:
    module = LIBRARY[m]
    params = _params(module, rng)
    source = f'"""{module.doc}"""\n\n' + _substitute(module.source, params)
    where = f"generated repo {index} ({repo}) module {module.name}"
    readme.append(f"- `{package}.{module.name}`: {module.doc}")
    if m != bug_m:
      expected, _ = _evaluate(module, source, source, where)
      files[f"{package}/{module.name}.py"] = source
      files[f"tests/test_{module.name}.py"] = _render_tests(package, module.name, source, list(module.cases), expected)
      continue
    bug = module.bugs[bug_b]
    good_snippet, bad_snippet = _substitute(bug.correct, params), _substitute(bug.buggy, params)
    if source.count(good_snippet) != 1:
      raise GeneratorError(f"{where}: bug snippet {good_snippet!r} occurs {source.count(good_snippet)} times")
    buggy = source.replace(good_snippet, bad_snippet)
    expected, failing = _evaluate(module, source, buggy, where)
    if not failing:
      raise GeneratorError(f"{where}: bug {bug.kind} in {bug.symbol} breaks no test")
    failing_names = {c.name for c in failing}
    base_cases = [c for c in module.cases if c.name not in failing_names]
    test_path = f"tests/test_{module.name}.py"
    base_tests = _render_tests(package, module.name, source, base_cases, expected)
    full_tests = _render_tests(package, module.name, source, list(module.cases), expected)
    files[f"{package}/{module.name}.py"] = buggy
    files[test_path] = base_tests
    old, new = _expert_fix(source, buggy, bug, params, where)
    shown = rng.choice(failing)
    statement, repro = issues.problem_statement(rng, project, package, module.name, version, shown,
                                                expected.get(shown.name), _run_case(_module_namespace(buggy, where),
                                                                                   shown))
    fail_to_pass = [f"{test_path}::test_{c.name}" for c in module.cases if c.name in failing_names]
    bug_info = dict(module=module.name, bug=bug, patch=unified_diff(f"{package}/{module.name}.py", buggy, source),
                    test_patch=unified_diff(test_path, base_tests, full_tests), fail_to_pass=fail_to_pass,
                    statement=statement, expert={"path": f"{package}/{module.name}.py", "old": old, "new": new,
                                                 "symbol": bug.symbol, "repro": repro})
  files["README.md"] = "\n".join(readme) + "\n\nRun the tests with `python -m pytest`.\n"
  pass_to_pass = []
  for path in sorted(p for p in files if p.startswith("tests/")):
    pass_to_pass += [f"{path}::{name}" for name in re.findall(r"^def (test_\w+)\(", files[path], re.MULTILINE)]
  instance = {"instance_id": f"{repo.replace('/', '__')}-{index + 1}", "repo": repo,
              "base_commit": git_commit_hash(files, COMMIT_MESSAGE), "patch": bug_info["patch"],
              "test_patch": bug_info["test_patch"], "problem_statement": bug_info["statement"], "hints_text": "",
              "created_at": "2024-01-01T00:00:00Z", "version": version, "FAIL_TO_PASS": bug_info["fail_to_pass"],
              "PASS_TO_PASS": pass_to_pass}
  return RepoSpec(index=index, repo=repo, package=package, files=files, instance=instance, expert=bug_info["expert"],
                  bug_kind=bug_info["bug"].kind, bug_module=bug_info["module"],
                  modules=tuple(LIBRARY[m].name for m in module_ids))


def git_commit_hash(files: dict[str, str], message: str) -> str:
  """The id git gives a root commit of `files` (all mode 100644) by `sandbox._git_env()`'s fixed author/date."""

  def obj(kind: str, body: bytes) -> bytes:
    return hashlib.sha1(f"{kind} {len(body)}\0".encode() + body).digest()

  def tree(entries: dict[str, Any]) -> bytes:
    # git sorts tree entries by name, with directories compared as if their name ended in "/".
    items = []
    for name, value in entries.items():
      if isinstance(value, dict):
        items.append((name + "/", b"40000 " + name.encode() + b"\0" + tree(value)))
      else:
        items.append((name, b"100644 " + name.encode() + b"\0" + obj("blob", value.encode())))
    return obj("tree", b"".join(body for _, body in sorted(items)))

  root: dict[str, Any] = {}
  for path, text in files.items():
    node = root
    *dirs, name = path.split("/")
    for d in dirs:
      node = node.setdefault(d, {})
    node[name] = text
  env = sandbox_lib._git_env()
  ident = lambda who: f"{env[f'GIT_{who}_NAME']} <{env[f'GIT_{who}_EMAIL']}> {env[f'GIT_{who}_DATE']}"
  body = f"tree {tree(root).hex()}\nauthor {ident('AUTHOR')}\ncommitter {ident('COMMITTER')}\n\n{message}"
  return obj("commit", body.encode()).hex()


def snapshot_of(index: int) -> dataset_lib.Snapshot:
  return dataset_lib.Snapshot("generated", f"v{VERSION}/{index}")


def materialize(snapshot_path: str) -> pathlib.Path:
  """The git repository of a "generated" snapshot (`v<VERSION>/<index>`), created in the cache on first use."""
  match = re.fullmatch(r"v(\d+)/(\d+)", snapshot_path)
  if match is None or int(match.group(1)) != VERSION:
    raise dataset_lib.DatasetError(f"generated snapshot {snapshot_path!r}: expected 'v{VERSION}/<index>'")
  s = spec(int(match.group(2)))
  # Keyed by the commit too: a library edit that changes a repository can never reuse a stale copy.
  dest = (bwrap.cache_dir() / "swe" / "generated" / f"v{VERSION}"
          / f"{s.repo.replace('/', '__')}-{s.instance['base_commit'][:12]}")
  if (dest / ".git").exists():
    return dest
  with _MATERIALIZE_LOCK:
    if (dest / ".git").exists():
      return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=".staging_", dir=dest.parent))
    try:
      for path, text in s.files.items():
        (staging / path).parent.mkdir(parents=True, exist_ok=True)
        (staging / path).write_text(text)
      sandbox_lib.git(staging, "init", "-q")
      sandbox_lib.git(staging, "add", "-A")
      sandbox_lib.git(staging, "commit", "-q", "-m", COMMIT_MESSAGE.rstrip("\n"))
      head = sandbox_lib.git(staging, "rev-parse", "HEAD").strip()
      if head != s.instance["base_commit"]:
        raise GeneratorError(f"{s.repo}: git made commit {head}, the generator computed {s.instance['base_commit']}")
      try:
        staging.rename(dest)
      except OSError:
        if not (dest / ".git").exists():  # not a concurrent process that finished first: a real failure
          raise
    finally:
      if staging.exists():
        shutil.rmtree(staging)
  return dest


def instance(index: int) -> dataset_lib.Instance:
  return dataset_lib.parse_instance(spec(index).instance, snapshot_of(index), f"generated repo {index}")


def bug_slot(index: int) -> tuple[int, int]:
  """(library module, bug) planted in generated repository `index`."""
  return _BUG_SLOTS[index % len(_BUG_SLOTS)]


def repo_name(index: int) -> str:
  """The repository name of generated repository `index` (cheap: no generation)."""
  return _NAMES[index]


def tasks(n: int, split: str | None = None) -> list[dict[str, Any]]:
  """Tasks of the first `n` generated repositories, or of those among them in `split` (no files are written)."""
  if not 1 <= n <= MAX_REPOS:
    raise ValueError(f"n: must be in [1, {MAX_REPOS}], got {n}")
  chosen = [i for i in range(n) if split is None or split_of(_NAMES[i]) == split]
  return [dict(instance(i).to_task(), expert=spec(i).expert, bug_kind=spec(i).bug_kind) for i in chosen]


def write_dataset(out_dir: pathlib.Path | str, n: int) -> pathlib.Path:
  """Exports the first `n` repositories as `out_dir/instances.jsonl` + git directories `out_dir/<owner>__<name>/`
  (the layout `dataset.load_jsonl(jsonl, snapshot_root=out_dir)` reads). Returns the JSONL path."""
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  instances = []
  for i in range(n):
    src = materialize(snapshot_of(i).path)
    dest = out / spec(i).repo.replace("/", "__")
    if not dest.exists():
      subprocess.run(["git", "clone", "-q", str(src), str(dest)], check=True, capture_output=True)
    instances.append(dataset_lib.parse_instance(spec(i).instance, dataset_lib.Snapshot("dir", str(dest))))
  path = out / "instances.jsonl"
  dataset_lib.write_jsonl(path, instances)
  return path
