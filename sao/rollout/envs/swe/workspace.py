"""An episode's changes as a unified diff, read on the host from the working tree's files — not from its `.git`.

    patch = workspace_diff(sandbox.repo_dir, base, max_bytes)    # BaseTree of the dataset's snapshot

The agent controls everything under its repository, `.git` included (config, filters, hooks, attributes, index), so
git is never run on it. Instead each regular file is compared with the snapshot's by content (`BaseTree.blob_id`),
and changed text files are diffed here (`patches.format_file`). Read as the host sees the tree, without following
any symlink: a symlink is reported as one (and never graded), a FIFO or device is skipped, `.git` and the caches
tools leave behind (`__pycache__`, `.pytest_cache`, ...) are not part of a patch. Runs after the episode's commands
have ended (every command's PID namespace is gone), so nothing changes the tree while it is read.
"""
from __future__ import annotations

import os
import stat

from sao.rollout.envs.swe import patches
from sao.rollout.envs.swe.base_tree import BaseTree

SKIPPED_DIRS = frozenset({".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".hypothesis", ".ruff_cache",
                          ".tox", ".nox"})


class DiffTooLargeError(ValueError):
  """The changed files hold more than the diff may."""


def _skipped(directory: str) -> bool:
  return directory in SKIPPED_DIRS or directory.endswith(".egg-info")


def _changed_content(path: str, size: int, base: BaseTree, rel: str, limit: int) -> bytes | None:
  """The file's content when it differs from the snapshot's `rel` (None when equal), read without following a
  symlink; an unchanged file of any size is only hashed, a changed one may hold at most `limit` bytes."""
  fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
  with os.fdopen(fd, "rb") as f:
    entry = base.files.get(rel)
    if entry is not None and entry[0] in ("100644", "100755"):
      digest = base.hasher(size)
      while chunk := f.read(1 << 20):
        digest.update(chunk)
      if digest.hexdigest() == entry[1]:
        return None
      f.seek(0)
    data = f.read(limit + 1)
  if len(data) > limit:
    raise DiffTooLargeError(f"{rel}: changed files hold more than {limit} bytes")
  return data


def workspace_diff(repo: os.PathLike | str, base: BaseTree, max_bytes: int) -> str:
  """The diff turning `base` into the working tree at `repo`; raises `DiffTooLargeError` past `max_bytes`."""
  repo = os.fspath(repo)
  present: dict[str, bytes | None] = {}   # changed path -> new content (None: a symlink, an unreadable file)
  seen = set()
  budget = max_bytes
  for dirpath, dirnames, filenames in os.walk(repo):  # does not descend into symlinked directories
    rel_dir = os.path.relpath(dirpath, repo)
    rel_dir = "" if rel_dir == "." else rel_dir + "/"
    dirnames[:] = sorted(d for d in dirnames if not _skipped(d))
    for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
      path = rel_dir + name
      info = os.lstat(os.path.join(dirpath, name))
      seen.add(path)
      if stat.S_ISLNK(info.st_mode):
        entry = base.files.get(path)
        target = os.readlink(os.path.join(dirpath, name)).encode("utf-8", "surrogateescape")
        if entry is None or entry[0] != patches.SYMLINK_MODE or entry[1] != base.blob_id(target):
          present[path] = None
        continue
      if not stat.S_ISREG(info.st_mode):
        continue
      try:
        data = _changed_content(os.path.join(dirpath, name), info.st_size, base, path, budget)
      except PermissionError:  # made unreadable to a non-root trainer: named, never applied (as a symlink is)
        present[path] = None
        continue
      if data is not None:
        present[path] = data
        budget -= len(data)
  deleted = sorted(p for p in base.files if p not in seen and base.files[p][0] != patches.GITLINK_MODE
                   and not any(_skipped(part) for part in p.split("/")[:-1]))
  old = base.read([p for p in list(present) + deleted if p in base.files and base.files[p][0] != patches.SYMLINK_MODE])
  out = []
  for path in sorted(set(present) | set(deleted)):
    new = present.get(path)
    symlink = path in present and new is None
    out.append(patches.format_file(path, old.get(path), None if path in deleted else new, symlink=symlink))
  diff = "".join(out)
  if len(diff.encode("utf-8", "surrogateescape")) > max_bytes:
    raise DiffTooLargeError(f"the diff is larger than {max_bytes} bytes")
  return diff
