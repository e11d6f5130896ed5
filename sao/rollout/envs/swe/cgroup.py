"""A memory bound per sandbox: one memory cgroup per episode, below the trainer's own, holding every process of every
command of the episode (and so charged for their tmpfs pages and memfds too).

    group = MemoryCgroup.create("sao_swe_x1y2", limit_bytes)    # None where the host gives us no memory cgroup
    argv = group.wrap(argv)                                       # the command starts inside it
    group.remove()                                                # once the episode's processes are gone

Both cgroup versions: v2 (`memory.max`, `memory.swap.max`) and v1 (`memory.limit_in_bytes`,
`memory.memsw.limit_in_bytes` where swap accounting is on). Past the limit the kernel reclaims, then its OOM killer
kills inside the group only: the host and the other sandboxes do not notice. Where the trainer cannot create a
child group (no memory controller, a read-only cgroup file system), `create` returns None and the per-process
`ulimit -v` remains the only bound (see docs/security.md).
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import time

_ROOT = pathlib.Path("/sys/fs/cgroup")


def _own_memory_cgroup() -> tuple[pathlib.Path, int] | None:
  """(directory, version) of the memory cgroup this process is in, or None."""
  try:
    lines = pathlib.Path("/proc/self/cgroup").read_text().splitlines()
  except OSError:
    return None
  for line in lines:
    _, controllers, path = line.split(":", 2)
    if "memory" in controllers.split(","):
      directory = _ROOT / "memory" / path.lstrip("/")
      if directory.is_dir():
        return directory, 1
  for line in lines:
    if line.startswith("0::"):
      directory = _ROOT / line[3:].lstrip("/")
      try:
        if "memory" in (directory / "cgroup.controllers").read_text().split():
          return directory, 2
      except OSError:
        return None
  return None


@dataclasses.dataclass
class MemoryCgroup:
  path: pathlib.Path
  version: int

  @classmethod
  def create(cls, name: str, limit_bytes: int) -> MemoryCgroup | None:
    """A new group `name` below this process's memory cgroup, limited to `limit_bytes` of memory (and no more
    memory+swap); None where the host does not let us create one."""
    own = _own_memory_cgroup()
    if own is None:
      return None
    parent, version = own
    if version == 2:
      try:  # children get the memory controller only when the parent delegates it
        (parent / "cgroup.subtree_control").write_text("+memory")
      except OSError:
        pass
    path = parent / name
    try:
      path.mkdir()
    except OSError:
      return None
    group = cls(path=path, version=version)
    try:
      if version == 1:
        (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
        if (path / "memory.memsw.limit_in_bytes").exists():
          (path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
      else:
        (path / "memory.max").write_text(str(limit_bytes))
        if (path / "memory.swap.max").exists():
          (path / "memory.swap.max").write_text("0")
    except OSError:
      group.remove()
      return None
    return group

  def wrap(self, argv: list[str]) -> list[str]:
    """`argv` started inside the group: a shell moves itself in, then execs it (refusing to run otherwise)."""
    return ["/bin/sh", "-c", 'echo $$ > "$1" || exit 125; shift; exec "$@"', "sh",
            str(self.path / "cgroup.procs"), *argv]

  def usage_bytes(self) -> int:
    name = "memory.usage_in_bytes" if self.version == 1 else "memory.current"
    return int((self.path / name).read_text())

  def remove(self, wait_s: float = 5.0) -> None:
    """Removes the group (idempotent); waits up to `wait_s` for the last processes to be gone."""
    deadline = time.monotonic() + wait_s
    while True:
      try:
        os.rmdir(self.path)
        return
      except FileNotFoundError:
        return
      except OSError:
        if time.monotonic() > deadline:
          return  # left behind, empty of use; the kernel frees it when its last process exits
        time.sleep(0.05)
