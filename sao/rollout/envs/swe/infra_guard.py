"""Restores the repository's test infrastructure to `base_commit` after the model patch is applied, before grading.

The grade must measure the patch's code, not its changes to how tests are collected, configured, run or reported.
So every path the model patch changed that is test infrastructure is reverted to the snapshot's version (deleted if
the snapshot has no such path):

  conftest.py              anywhere (fixtures, hooks: a hook can rewrite every report to "passed")
  test settings            pytest.ini, .pytest.ini, tox.ini, setup.cfg, pyproject.toml (addopts can load plugins)
  interpreter start-up     sitecustomize.py, usercustomize.py, *.pth anywhere
  test files               test_*.py, *_test.py (the graded tests are the snapshot's plus the hidden test patch)
  compiled Python          *.pyc, anything under __pycache__ (an unchecked-hash .pyc runs instead of its source)
  repository plugins       modules the snapshot's own conftests (`pytest_plugins`) or settings (`-p name`) load
  shadowing modules        a module or package named like a standard-library, pytest or pluggy module, at a place
                           where it can be imported top-level (its directory is not a package)

Like the editor, this runs *inside* the grading sandbox (`python3 -I -S -c <this file's source>`, the base commit as
JSON on stdin): `-I -S` keep the repository's files off `sys.path`, and it only reads git objects of the fresh
clone (which the model patch cannot change: patches touching `.git` are refused first). It prints one JSON object:
{"reverted": [paths]} and exits 0, or prints an error and exits 1. Standard library only.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys

CONFIG_FILES = frozenset({"pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"})
STARTUP_FILES = frozenset({"sitecustomize.py", "usercustomize.py"})
# Importable top-level names a test run depends on; "test" (CPython's own tests) is not, and is a common directory.
SHADOWED = (frozenset(sys.stdlib_module_names) | {"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging",
                                                   "exceptiongroup", "tomli"}) - {"test", "__future__"}
_MODULE_SUFFIXES = (".py", ".pyc", ".so", ".pyd", ".pyw")
FAILURE = "test infrastructure could not be restored"
_GIT = ["git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "-c", "core.quotePath=false"]


def _git(*args: str) -> bytes:
  proc = subprocess.run(_GIT + list(args), capture_output=True)
  if proc.returncode != 0:
    raise RuntimeError(f"git {args[0]} failed: {proc.stderr.decode(errors='replace')[-300:]}")
  return proc.stdout


def changed_paths(base: str) -> list[str]:
  """Every file that differs from `base`: modified, deleted, type-changed, and every untracked file (ignored ones
  included: a patch may add a path its own .gitignore hides)."""
  tracked = _git("diff-index", "--name-only", "-z", "--no-renames", base)
  untracked = _git("ls-files", "-z", "--others")
  return [p for p in (tracked + untracked).decode("utf-8", "surrogateescape").split("\0") if p]


def plugin_modules(base: str, base_files: set[str]) -> set[str]:
  """Module names the snapshot's conftests (`pytest_plugins = ...`) and settings (`-p name`) load as plugins."""
  names = set()
  for path in base_files:
    name = os.path.basename(path)
    if name != "conftest.py" and name not in CONFIG_FILES:
      continue
    text = _git("show", f"{base}:{path}").decode("utf-8", "replace")
    if name in CONFIG_FILES:
      names.update(re.findall(r"(?:^|[\s\"',\[=])-p\s*[\"']?([A-Za-z_][\w.]*)", text, re.MULTILINE))
      continue
    try:
      tree = ast.parse(text)
    except SyntaxError:
      continue
    for node in ast.walk(tree):
      if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if any(isinstance(t, ast.Name) and t.id == "pytest_plugins" for t in targets) and node.value is not None:
          names.update(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)
                       and isinstance(c.value, str))
  return names


def _is_package(directory: str) -> bool:
  return os.path.isfile(os.path.join(directory, "__init__.py"))


def is_infrastructure(path: str, plugin_prefixes: tuple[str, ...]) -> bool:
  """Whether a changed `path` (relative to the repository root) is test infrastructure; see the module docstring."""
  parts = path.split("/")
  name = parts[-1]
  if (name == "conftest.py" or name in CONFIG_FILES or name in STARTUP_FILES or name.endswith(".pth")
      or name.endswith(".pyc") or "__pycache__" in parts
      or (name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")))):
    return True
  if any(path == p or path.startswith(p + "/") for p in plugin_prefixes):
    return True
  for i, part in enumerate(parts):
    last = i == len(parts) - 1
    if last and not name.endswith(_MODULE_SUFFIXES):
      break
    module = part.split(".")[0] if last else part
    here = "/".join(parts[:i + 1])
    if module in SHADOWED and (last or _is_package(here)) and not _is_package("/".join(parts[:i]) or "."):
      return True
  return False


def _plugin_prefixes(modules: set[str], base_files: set[str]) -> tuple[str, ...]:
  """Repository paths (module files or package directories) of `modules`, from the root, `src/`, or any directory
  holding a conftest (pytest puts those on sys.path)."""
  roots = {""} | {"src/"} | {os.path.dirname(f) + "/" for f in base_files if f.endswith("conftest.py") and "/" in f}
  prefixes = []
  for module in modules:
    relative = module.replace(".", "/")
    for root in roots:
      if root + relative + ".py" in base_files:
        prefixes.append(root + relative + ".py")
      elif any(f.startswith(root + relative + "/") for f in base_files):
        prefixes.append(root + relative)
  return tuple(prefixes)


def _remove(path: str) -> None:
  if os.path.islink(path) or os.path.isfile(path):
    os.unlink(path)
  elif os.path.isdir(path):
    shutil.rmtree(path)


def revert(base: str) -> list[str]:
  """Reverts every changed test-infrastructure path to `base`; returns them (sorted)."""
  base_files = set(_git("ls-tree", "-r", "-z", "--name-only", base).decode("utf-8", "surrogateescape")
                   .split("\0")) - {""}
  prefixes = _plugin_prefixes(plugin_modules(base, base_files), base_files)
  chosen = sorted({p for p in changed_paths(base) if is_infrastructure(p, prefixes)})
  restore = [p for p in chosen if p in base_files]
  for path in chosen:
    if path not in base_files:
      _remove(path)
  for path in restore:
    # A directory the patch put in place of the file, or a symlink on the way, goes first.
    parts = path.split("/")
    for i in range(1, len(parts)):
      parent = "/".join(parts[:i])
      if os.path.islink(parent) or (os.path.exists(parent) and not os.path.isdir(parent)):
        _remove(parent)
    _remove(path)
  if restore:
    _git("checkout", "-q", base, "--", *restore)
  return chosen


def main() -> int:
  try:
    base = json.loads(sys.stdin.read())["base"]
    print(json.dumps({"reverted": revert(base)}))
    return 0
  except Exception as e:  # noqa: BLE001 — reported to the grader, which scores the patch 0
    print(f"{FAILURE}: {type(e).__name__}: {e}")
    return 1


if __name__ == "__main__":
  sys.exit(main())
