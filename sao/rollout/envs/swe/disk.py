"""Disk bookkeeping of an episode directory: how much it holds, removing it whatever a command did to it, and writing
the grader's files into a fresh checkout."""
from __future__ import annotations

import os
import pathlib
import shutil
import stat


def tree_bytes(path: pathlib.Path) -> int:
  """Disk space used under `path` (allocated blocks, each inode once, symlinks not followed)."""
  return tree_usage(path)[0]


def tree_usage(path: pathlib.Path) -> tuple[int, int]:
  """(bytes, inodes) used under `path`: allocated blocks and distinct inodes (a symlink or an empty file costs an
  inode and next to no blocks), symlinks not followed. A directory the command made unreadable is made readable
  again first (it is ours), so nothing can be hidden from the count."""
  seen, total, stack = set(), 0, [str(path)]
  while stack:
    directory = stack.pop()
    try:
      entries = list(os.scandir(directory))
    except PermissionError:
      os.chmod(directory, stat.S_IRWXU)
      entries = list(os.scandir(directory))
    except FileNotFoundError:
      continue
    for entry in entries:
      try:
        info = entry.stat(follow_symlinks=False)
      except FileNotFoundError:
        continue
      if (info.st_dev, info.st_ino) not in seen:
        seen.add((info.st_dev, info.st_ino))
        total += info.st_blocks * 512
      if stat.S_ISDIR(info.st_mode):
        stack.append(entry.path)
  return total, len(seen)


def rmtree(path: pathlib.Path) -> None:
  """Removes `path` even where a command made directories unwritable or unreadable (chmod 000)."""

  def fix(func, p, exc_info):
    if isinstance(exc_info[1], FileNotFoundError):
      return
    parent = os.path.dirname(p)
    os.chmod(parent, stat.S_IRWXU)
    if os.path.isdir(p) and not os.path.islink(p):
      os.chmod(p, stat.S_IRWXU)
      shutil.rmtree(p, onerror=fix)
    else:
      os.unlink(p)

  if path.exists():
    shutil.rmtree(path, onerror=fix)


def write_overlay(repo: pathlib.Path, overlay: dict[str, bytes | None]) -> None:
  """Writes `overlay` (relative path -> content, None: delete) into a fresh checkout, on the host, before any
  command has run there. Deletions go first. Every path must be relative and normal, and no directory on its way a
  symlink (the snapshot may hold symlinks; the host never follows one): else `ValueError`, nothing followed."""
  def checked(path: str) -> pathlib.Path:
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..", ".git") for p in parts) or "\0" in path:
      raise ValueError(f"overlay path {path!r} is not a plain relative path")
    for i in range(1, len(parts) + 1):
      here = repo.joinpath(*parts[:i])
      if here.is_symlink() or (i < len(parts) and here.exists() and not here.is_dir()):
        raise ValueError(f"overlay path {path!r}: {'/'.join(parts[:i])} is a symlink or not a directory")
    return repo.joinpath(*parts)

  for path, content in sorted(overlay.items()):
    if content is None and (target := checked(path)).exists():
      target.unlink()
  for path, content in sorted(overlay.items()):
    if content is not None:
      target = checked(path)
      target.parent.mkdir(parents=True, exist_ok=True)
      fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
      with os.fdopen(fd, "wb") as f:
        f.write(content)
