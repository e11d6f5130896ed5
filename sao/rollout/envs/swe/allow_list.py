"""Which of a model patch's changes reach the graded tree: changes to the repository's source, and nothing else.

The grader builds the tree it tests from the base snapshot, the model patch's changes to *source* files, and the
instance's test patch. A changed path is source unless it is one of these (then the change is dropped and the path
named in `GradeResult.neutralised`):

  outside the tree         an absolute path, `..`, an empty or `.` component, a NUL byte
  hidden                   any component starting with "." (`.git/`, `.gitattributes`, `.pytest.toml`, caches)
  test code                any path under a `tests/` or `test/` directory; `test_*.py`, `*_test.py`; `conftest.py`
  test settings            pytest.ini, pytest.toml, tox.ini, setup.cfg, pyproject.toml (anywhere)
  interpreter start-up     sitecustomize.py, usercustomize.py, *.pth
  compiled Python          *.pyc, anything under __pycache__ (an unchecked-hash .pyc runs instead of its source)
  repository plugins       modules the snapshot's own conftests (`pytest_plugins`) or settings (`-p name`) load
  shadowing modules        a module or package named like a standard-library, pytest or pluggy module, or like any
                           module the Python installation provides that the snapshot does not (a `numpy.py` whose
                           `allclose` is always true), where it can be imported top-level (its directory is not a
                           package)
  not a plain text file    binary content, symlinks, submodules (`patches.FileChange.special`)

This is an allow-list in effect: whatever the patch changes that is not source is simply not in the graded tree
(the tree is built, not cleaned), so a file name that a future tool learns to read cannot smuggle anything in.
Pure functions over paths and the snapshot's files.
"""
from __future__ import annotations

import ast
import functools
import os
import re
import sys

CONFIG_FILES = frozenset({"pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg",
                          "pyproject.toml"})
STARTUP_FILES = frozenset({"sitecustomize.py", "usercustomize.py"})
TEST_DIRS = frozenset({"tests", "test"})
# Importable top-level names a test run depends on; "test" (CPython's own tests) is a test directory here anyway.
SHADOWED = (frozenset(sys.stdlib_module_names) | {"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging",
                                                   "exceptiongroup", "tomli"}) - {"__future__"}
_MODULE_SUFFIXES = (".py", ".pyc", ".so", ".pyd", ".pyw")


@functools.cache
def installed_modules() -> frozenset[str]:
  """Top-level module names of the Python installation the tests run with (standard library and site-packages;
  the sandbox mounts the same installation)."""
  import pkgutil
  prefixes = tuple(os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
  paths = [p for p in sys.path if p and os.path.realpath(p).startswith(prefixes)]
  return frozenset(m.name for m in pkgutil.iter_modules(paths)) | frozenset(sys.builtin_module_names)


def importable_names(files: set[str]) -> set[str]:
  """Module names `files` (a tree) provide at a top-level position: a module or package in a directory that is
  not itself a package."""
  names = set()
  for path in files:
    parts = path.split("/")
    for i, part in enumerate(parts):
      last = i == len(parts) - 1
      if last and not part.endswith(_MODULE_SUFFIXES):
        break
      parent = "/".join(parts[:i])
      if (parent + "/__init__.py" if parent else "__init__.py") not in files:
        names.add(part.split(".")[0] if last else part)
  return names


def shadowable(base_files: set[str]) -> frozenset[str]:
  """The names a changed path must not take at a top-level position: the standard library's, pytest's and
  pluggy's always; any other installed module's unless the snapshot itself provides it there (a repository that is
  installed into its own environment, as SWE-bench's are)."""
  return SHADOWED | (installed_modules() - importable_names(base_files))


def unsafe(path: str) -> bool:
  """Whether `path` could name something outside the repository."""
  parts = path.split("/")
  return not path or path.startswith("/") or "\0" in path or any(p in ("", ".", "..") for p in parts)


def plugin_modules(config_and_conftests: dict[str, str]) -> set[str]:
  """Module names the snapshot's conftests (`pytest_plugins = ...`) and settings (`-p name`) load as plugins;
  `config_and_conftests` maps each such file of the snapshot to its text."""
  names = set()
  for path, text in config_and_conftests.items():
    name = os.path.basename(path)
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


def plugin_prefixes(modules: set[str], base_files: set[str]) -> tuple[str, ...]:
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


def not_source(path: str, plugin_prefixes: tuple[str, ...], tree_files: set[str],
               shadowed: frozenset[str] = SHADOWED) -> str:
  """Why a changed `path` is not source ("" when it is); `tree_files` are the files of the graded tree (to tell a
  package from a plain directory), `shadowed` the module names it must not take (`shadowable`)."""
  if unsafe(path):
    return "outside the repository"
  parts = path.split("/")
  name = parts[-1]
  if any(p.startswith(".") for p in parts):
    return "hidden path"
  if any(p in TEST_DIRS for p in parts[:-1]) or name == "conftest.py" or (
      name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))):
    return "test code"
  if name in CONFIG_FILES:
    return "test settings"
  if name in STARTUP_FILES or name.endswith(".pth"):
    return "interpreter start-up"
  if name.endswith(".pyc") or "__pycache__" in parts:
    return "compiled Python"
  if any(path == p or path.startswith(p + "/") for p in plugin_prefixes):
    return "repository plugin"

  def is_package(directory: str) -> bool:
    return (directory + "/__init__.py" if directory else "__init__.py") in tree_files

  for i, part in enumerate(parts):
    last = i == len(parts) - 1
    if last and not name.endswith(_MODULE_SUFFIXES):
      break
    module = part.split(".")[0] if last else part
    here = "/".join(parts[:i + 1])
    if module in shadowed and (last or is_package(here)) and not is_package("/".join(parts[:i])):
      return "shadows an installed module"
  return ""
