"""Materialises a repository snapshot: the local path `git clone` reads for a `dataset.Snapshot`.

    source = git_source(instance.snapshot)   # "dir" / "bundle": as is; "tarball": unpacked once into the cache
                                             # ($SAO_CACHE_DIR/swe/tarballs); "generated": built once by `generator`

Separate from `dataset` (the format and its validation), which the generator itself builds on.
"""
from __future__ import annotations

import os
import pathlib
import tarfile

from sao.rollout.envs.swe import bwrap
from sao.rollout.envs.swe import dataset as dataset_lib
from sao.rollout.envs.swe import generator


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
  def build(staging: pathlib.Path) -> None:
    with tarfile.open(tarball) as tf:
      tf.extractall(staging, filter="data")  # "data" refuses absolute paths, links out of the tree, devices

  try:
    dest = bwrap.cached_build(tarball, "tarballs", build)
  except (tarfile.TarError, OSError) as e:
    raise dataset_lib.DatasetError(f"snapshot {tarball}: cannot unpack ({type(e).__name__}: {e})") from e
  if (dest / ".git").exists():
    return dest
  children = [c for c in dest.iterdir()]
  if len(children) == 1 and (children[0] / ".git").exists():
    return children[0]
  raise dataset_lib.DatasetError(
      f"snapshot {tarball}: holds no git repository at its top level or in one top-level directory")
