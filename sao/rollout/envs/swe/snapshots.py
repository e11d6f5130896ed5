"""Materialises a repository snapshot: the local path `git clone` reads for a `dataset.Snapshot`.

    source = git_source(instance.snapshot)   # "dir" / "bundle": as is; "tarball": unpacked once into the cache
                                             # ($SAO_CACHE_DIR/swe/tarballs); "generated": built once by `generator`

Separate from `dataset` (the format and its validation), which the generator itself builds on.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import tarfile
import tempfile
import threading

from sao.rollout.envs.swe import bwrap
from sao.rollout.envs.swe import dataset as dataset_lib
from sao.rollout.envs.swe import generator

_UNPACK_LOCK = threading.Lock()


def git_source(snapshot: dataset_lib.Snapshot) -> str:
  """A path `git clone` accepts (a repository or a bundle); unpacks tarballs / generates repositories once.
  Raises `DatasetError` when the snapshot is missing or unusable."""
  if snapshot.kind in ("dir", "bundle"):
    if not os.path.exists(snapshot.path):
      raise dataset_lib.DatasetError(f"snapshot {snapshot.path} does not exist")
    return snapshot.path
  if snapshot.kind == "tarball":
    return str(unpack_tarball(pathlib.Path(snapshot.path)))
  return str(generator.materialize(snapshot.path))


def unpack_tarball(tarball: pathlib.Path) -> pathlib.Path:
  """The git repository inside `tarball`, unpacked once into the cache (keyed by path, size and mtime)."""
  if not tarball.is_file():
    raise dataset_lib.DatasetError(f"snapshot {tarball} does not exist")
  st = tarball.stat()
  key = hashlib.sha256(f"{tarball.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
  dest = bwrap.cache_dir() / "swe" / "tarballs" / key
  with _UNPACK_LOCK:
    if not dest.exists():
      dest.parent.mkdir(parents=True, exist_ok=True)
      staging = pathlib.Path(tempfile.mkdtemp(prefix="unpack_", dir=dest.parent))
      try:
        with tarfile.open(tarball) as tf:
          tf.extractall(staging, filter="data")  # "data" refuses absolute paths, links out of the tree, devices
        staging.rename(dest)
      except (tarfile.TarError, OSError) as e:
        raise dataset_lib.DatasetError(f"snapshot {tarball}: cannot unpack ({type(e).__name__}: {e})") from e
      finally:
        if staging.exists():
          shutil.rmtree(staging)
  if (dest / ".git").exists():
    return dest
  children = [c for c in dest.iterdir()]
  if len(children) == 1 and (children[0] / ".git").exists():
    return children[0]
  raise dataset_lib.DatasetError(
      f"snapshot {tarball}: holds no git repository at its top level or in one top-level directory")
