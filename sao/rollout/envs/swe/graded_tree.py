"""The tree the grader tests, built from an allow-list: the base snapshot, the model patch's changes to source files,
and the instance's test patch — each read and applied by the grader itself (`patches`), from the dataset's own git
objects (`base_tree`), never through an episode's `.git`, git filters, hooks or attributes, or a fuzzy `patch`.

    tree = build(instance, model_patch, base)    # GradedTree, or raises ModelPatchError / TestPatchError
    tree.overlay                                 # path -> bytes (None: deleted), written over a fresh checkout
    tree.neutralised                             # the model patch's paths left out (`allow_list`), sorted
    tree.source_changed                          # the model patch's paths that are in the graded tree

and the pytest configuration the grader owns (`pytest_config`): the snapshot's own, found as pytest would find it
but read from the snapshot's objects, so nothing in the graded tree is read as configuration.
"""
from __future__ import annotations

import dataclasses
import os
import re

from sao.rollout.envs.swe import allow_list
from sao.rollout.envs.swe import patches
from sao.rollout.envs.swe.base_tree import BaseTree
from sao.rollout.envs.swe.dataset import Instance

# pytest's own order of configuration files in one directory (`_pytest.config.findpaths.CONFIG_LOADERS_BY_NAME`).
_CONFIG_ORDER = ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini",
                 "setup.cfg")
_CONFIG_SECTION = {"pyproject.toml": re.compile(r"^\[tool\.pytest(\.ini_options)?\]", re.MULTILINE),
                   "tox.ini": re.compile(r"^\[pytest\]", re.MULTILINE),
                   "setup.cfg": re.compile(r"^\[tool:pytest\]", re.MULTILINE)}
DEFAULT_CONFIG = ("pytest.ini", "[pytest]\n")


class ModelPatchError(ValueError):
  """The model patch is not a unified diff, or its source changes do not apply: graded 0, the policy's doing."""


class TestPatchError(ValueError):
  """The instance's test patch does not apply to the snapshot: the grade is void."""


@dataclasses.dataclass(frozen=True)
class GradedTree:
  overlay: dict[str, bytes | None]
  neutralised: tuple[str, ...]
  source_changed: tuple[str, ...]


def _text(base: BaseTree, path: str | None, contents: dict[str, bytes]) -> str | None:
  if path is None or path not in base.files:
    return None
  text = patches.decode(contents[path])
  if text is None:
    raise patches.PatchError(f"{path}: the snapshot's file is binary")
  return text


def _apply_all(changes: list[patches.FileChange], base: BaseTree, current: dict[str, bytes | None]) -> None:
  """Applies `changes` in order over `current` (path -> new content; paths absent from it are the snapshot's)."""
  wanted = [p for c in changes for p in c.paths if p in base.files and p not in current]
  contents = base.read(wanted)
  for change in changes:
    def now(path):
      if path in current:
        return None if current[path] is None else patches.decode(current[path])
      return _text(base, path, contents)
    new = patches.apply(change, now(change.old_path) if change.old_path else None)
    if change.old_path is not None and change.old_path != change.new_path and not change.copy:
      current[change.old_path] = None
    if change.new_path is not None:
      current[change.new_path] = new.encode("utf-8")
    elif change.old_path is not None:
      current[change.old_path] = None


def build(instance: Instance, model_patch: str, base: BaseTree) -> GradedTree:
  """The graded tree of `model_patch` on `instance` (see the module docstring)."""
  try:
    changes = patches.parse(model_patch)
  except patches.PatchError as e:
    raise ModelPatchError(f"the model patch is not a unified diff: {e}") from None
  try:
    test_changes = patches.parse(instance.test_patch)
  except patches.PatchError as e:
    raise TestPatchError(f"test_patch: {e}") from None
  test_paths = {p for c in test_changes for p in c.paths}
  prefixes = allow_list.plugin_prefixes(allow_list.plugin_modules(_config_and_conftests(base)), set(base.files))
  # The files the graded tree would hold if every change were taken: tells a package from a plain directory.
  tree_files = set(base.files) | {c.new_path for c in changes if c.new_path}
  shadowed = allow_list.shadowable(set(base.files))
  neutralised, kept = set(), []
  for change in changes:
    reasons = [allow_list.not_source(p, prefixes, tree_files, shadowed) for p in change.paths]
    symlinked = [p for p in change.paths if _through_symlink(p, base)]
    if change.special or any(reasons) or symlinked or any(p in test_paths for p in change.paths):
      neutralised.update(change.paths)
    else:
      kept.append(change)
  current: dict[str, bytes | None] = {}
  try:
    _apply_all(kept, base, current)
  except patches.PatchError as e:
    raise ModelPatchError(f"the model patch does not apply: {e}") from None
  source_changed = tuple(sorted(p for p, v in current.items()
                                if (v is not None or p in base.files) and not (v and base.same_content(p, v))))
  test_result: dict[str, bytes | None] = {}
  try:  # onto the snapshot's versions of its files, as SWE-bench resets them first
    _apply_all(test_changes, base, test_result)
  except patches.PatchError as e:
    raise TestPatchError(f"test_patch does not apply: {e}") from None
  overlay = {p: v for p, v in current.items() if p not in test_result}
  overlay.update(test_result)
  live = {p for p in base.files if overlay.get(p, b"") is not None} | {p for p, v in overlay.items() if v is not None}
  for path, content in overlay.items():
    parts = path.split("/")
    if content is not None and any("/".join(parts[:i]) in live for i in range(1, len(parts))):
      raise ModelPatchError(f"the model patch leaves a file where {path} needs a directory")
  return GradedTree(overlay=overlay, neutralised=tuple(sorted(neutralised)), source_changed=source_changed)


def _through_symlink(path: str, base: BaseTree) -> bool:
  """Whether `path`, or a directory on its way, is a symlink or a submodule in the snapshot."""
  parts = path.split("/")
  for i in range(1, len(parts) + 1):
    entry = base.files.get("/".join(parts[:i]))
    if entry is not None and entry[0] in (patches.SYMLINK_MODE, patches.GITLINK_MODE):
      return True
  return False


def _config_and_conftests(base: BaseTree) -> dict[str, str]:
  paths = [p for p in base.files if base.files[p][0] in ("100644", "100755")
           and (os.path.basename(p) == "conftest.py" or os.path.basename(p) in allow_list.CONFIG_FILES)]
  return {p: data.decode("utf-8", "replace") for p, data in base.read(paths).items()}


def pytest_config(base: BaseTree, test_files: list[str]) -> tuple[str, str]:
  """(file name, text) of the configuration pytest would use for `test_files` in the snapshot: the first file of
  `_CONFIG_ORDER` holding pytest settings in the test files' common directory or a parent of it; else an empty one.
  The runner passes it with `-c`, from outside the tree."""
  dirs = [os.path.dirname(f) for f in test_files] or [""]
  common = os.path.commonpath(dirs) if all(dirs) else ""
  chain = []
  while True:
    chain.append(common)
    if not common:
      break
    common = os.path.dirname(common)
  for directory in chain:
    for name in _CONFIG_ORDER:
      path = f"{directory}/{name}" if directory else name
      if path in base.files and base.files[path][0] in ("100644", "100755"):
        text = base.read([path])[path].decode("utf-8", "replace")
        pattern = _CONFIG_SECTION.get(name)
        if pattern is None or pattern.search(text):
          return name, text
  return DEFAULT_CONFIG
