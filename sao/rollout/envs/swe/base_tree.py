"""The base snapshot as the grader reads it: paths, modes and contents at `base_commit`, from the dataset's own git
objects — never from an episode's `.git`, which the agent controls.

    base = BaseTree.open(snapshots.git_source(instance.snapshot), instance.base_commit)
    base.files["calc/ops.py"]          # (mode, object id)
    base.read(["calc/ops.py"])         # {path: bytes}
    base.same_content("calc/ops.py", data)

A git bundle is unbundled once into the cache (`$SAO_CACHE_DIR/swe/bundles`) so its objects can be read. git runs
with no user or system configuration and no hooks; the repository is the dataset's, so nothing of an episode is read.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile

from sao.rollout.envs.swe import bwrap



class BaseTreeError(RuntimeError):
  """The snapshot cannot be read at the base commit."""


def _git(store: str, *args: str, input: bytes | None = None) -> bytes:
  env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1",
         "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
  proc = subprocess.run(["git", "-c", "safe.directory=*", "-c", "core.hooksPath=/dev/null", "-c",
                         "core.fsmonitor=false", "-C", store, *args], input=input, capture_output=True, env=env,
                        timeout=300)
  if proc.returncode != 0:
    raise BaseTreeError(f"git {args[0]} in {store} failed: {proc.stderr.decode(errors='replace')[-500:]}")
  return proc.stdout


def object_store(source: str) -> str:
  """A git directory holding `source`'s objects: `source` itself, or for a bundle its one-time bare clone."""
  if os.path.isdir(source):
    return source
  build = lambda staging: _git(str(staging.parent), "clone", "-q", "--bare", "--mirror", source, str(staging))
  return str(bwrap.cached_build(pathlib.Path(source), "bundles", build))


def history_upto(source: str, commit: str) -> str:
  """A bare repository holding exactly the history reachable from `commit` (built once into the cache,
  `$SAO_CACHE_DIR/swe/history`): episodes clone from it, so no later commit — the fix, the hidden tests — is among
  their objects, not even unreachable (`git fsck --lost-found` would otherwise find it)."""
  store = object_store(source)
  st = os.stat(store)
  key = hashlib.sha256(f"{os.path.realpath(store)}|{st.st_mtime_ns}|{commit}".encode()).hexdigest()[:20]
  dest = bwrap.cache_dir() / "swe" / "history" / key
  if dest.exists():
    return str(dest)
  dest.parent.mkdir(parents=True, exist_ok=True)
  staging = pathlib.Path(tempfile.mkdtemp(prefix="history_", dir=dest.parent))
  try:
    _git(str(staging), "init", "-q", "--bare", ".")
    _git(str(staging), "fetch", "-q", "--no-tags",
         "--upload-pack=git -c uploadpack.allowAnySHA1InWant=true upload-pack", os.path.realpath(store),
         f"{commit}:refs/heads/base")
    try:
      staging.rename(dest)  # atomic; another process may have built it meanwhile
    except OSError:
      if not dest.exists():
        raise
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return str(dest)


@dataclasses.dataclass
class BaseTree:
  """The files of one commit: `files` maps each path to (mode, object id); `read` returns contents."""
  store: str
  commit: str
  files: dict[str, tuple[str, str]]
  object_format: str

  @classmethod
  def open(cls, source: str, commit: str) -> BaseTree:
    store = object_store(source)
    listing = _git(store, "ls-tree", "-r", "-z", "--full-tree", commit)
    files = {}
    for entry in listing.decode("utf-8", "surrogateescape").split("\0"):
      if entry:
        meta, path = entry.split("\t", 1)
        mode, _, oid = meta.split(" ")
        files[path] = (mode, oid)
    object_format = _git(store, "rev-parse", "--show-object-format").decode().strip() or "sha1"
    return cls(store=store, commit=commit, files=files, object_format=object_format)

  def read(self, paths) -> dict[str, bytes]:
    """The contents of `paths` (each a file of the commit), read in one `git cat-file --batch`."""
    paths = [p for p in dict.fromkeys(paths)]
    if not paths:
      return {}
    oids = [self.files[p][1] for p in paths]
    out = _git(self.store, "cat-file", "--batch", input="".join(o + "\n" for o in oids).encode())
    contents, pos = {}, 0
    for path, oid in zip(paths, oids):
      header_end = out.index(b"\n", pos)
      header = out[pos:header_end].split()
      if len(header) != 3 or header[0].decode() != oid:
        raise BaseTreeError(f"cannot read {path} ({oid}) at {self.commit}: {out[pos:header_end][:200]!r}")
      size = int(header[2])
      contents[path] = out[header_end + 1:header_end + 1 + size]
      pos = header_end + 1 + size + 1
    return contents

  def hasher(self, size: int):
    """A hash object that, fed the `size` bytes of a file, gives the id git gives that file's blob."""
    digest = hashlib.new("sha256" if self.object_format == "sha256" else "sha1")
    digest.update(b"blob %d\0" % size)
    return digest

  def blob_id(self, data: bytes) -> str:
    """The id git gives a file holding `data` (to compare a file with the commit's without reading the commit's)."""
    digest = self.hasher(len(data))
    digest.update(data)
    return digest.hexdigest()

  def same_content(self, path: str, data: bytes) -> bool:
    entry = self.files.get(path)
    return entry is not None and entry[0] in ("100644", "100755") and entry[1] == self.blob_id(data)
