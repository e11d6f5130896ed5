"""Who a sandboxed command runs as on the host: never root, and (when the trainer is root) a uid of its own.

A user namespace alone does not make a command unprivileged: bubblewrap started by root maps the sandbox's uid to
host uid 0, so the command owns root's files (`/etc/shadow`) and passes the kernel's sysctl permission check
(`/proc/sys/kernel/core_pattern` is writable — a way to run code as host root). So:

  trainer is root      every sandbox leases a dedicated host uid/gid from `UID_BASE` .. `UID_BASE + UID_COUNT - 1`
                       (a flock on `<tmp>/sao_sandbox_uids/<uid>` makes the lease unique host-wide, also across
                       processes); the episode's files are chowned to it, and bubblewrap (as root, without a user
                       namespace) drops to it with `setpriv` before the command starts: no capabilities, no
                       supplementary groups, no-new-privs. Because the uid is the sandbox's alone, RLIMIT_NPROC counts
                       exactly that sandbox's processes.
  trainer is not root  the command runs as the trainer's own (unprivileged) uid inside a user namespace (uid 1000
                       inside); RLIMIT_NPROC, set inside the namespace, counts that namespace's processes (Linux >=
                       5.14 counts per user namespace).

The range sits between systemd-nspawn's container range (up to 0x6FFFFFFF) and systemd's "foreign" range
(0x7FFE0000): no account of the host is expected there.
"""
from __future__ import annotations

import dataclasses
import fcntl
import os
import pathlib
import shutil
import stat
import tempfile

UID_BASE = 2_000_000_000
UID_COUNT = 65_536
INSIDE_UID = 1000  # the uid commands see in user-namespace mode


class IdentityError(RuntimeError):
  """No unprivileged identity can be set up for a sandbox (no free uid, no `setpriv`, unsafe lock directory)."""


@dataclasses.dataclass
class Identity:
  """The host identity of one sandbox's commands.

  Attributes:
    uid, gid: the ids commands run as on the host (drop mode) or see inside (user-namespace mode).
    drop: True when the trainer is root and bubblewrap must drop to `uid`/`gid` (no user namespace).
  """
  uid: int
  gid: int
  drop: bool
  _lock_fd: int | None = None

  def release(self) -> None:
    """Frees the uid for another sandbox (idempotent)."""
    if self._lock_fd is not None:
      os.close(self._lock_fd)  # closing drops the flock
      self._lock_fd = None

  def passwd(self) -> str:
    """/etc/passwd as commands see it: no host account is listed."""
    return (f"root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{self.uid}:{self.gid}:sandbox:/tmp:/bin/bash\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")

  def group(self) -> str:
    return f"root:x:0:\nsandbox:x:{self.gid}:\nnogroup:x:65534:\n"


def _lock_dir() -> pathlib.Path:
  path = pathlib.Path(tempfile.gettempdir()) / "sao_sandbox_uids"
  try:
    path.mkdir(mode=0o700)
  except FileExistsError:
    pass
  info = os.lstat(path)
  if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
    raise IdentityError(f"{path} is not a directory owned by uid {os.geteuid()} and writable only by it: refusing "
                        "to lease sandbox uids from it")
  return path


def lease() -> Identity:
  """The identity of a new sandbox; when the trainer is root, the lowest free uid of the range, unique host-wide
  while leased (release it with `release`). Reusing uids keeps the lock directory as small as the concurrency."""
  if os.geteuid() != 0:
    return Identity(uid=INSIDE_UID, gid=INSIDE_UID, drop=False)
  if shutil.which("setpriv") is None:
    raise IdentityError("the trainer runs as root, so sandboxed commands must drop to an unprivileged uid, which "
                        "needs `setpriv` (util-linux) on PATH; install it")
  directory = _lock_dir()
  for uid in range(UID_BASE, UID_BASE + UID_COUNT):
    fd = os.open(directory / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      os.close(fd)
      continue
    return Identity(uid=uid, gid=uid, drop=True, _lock_fd=fd)
  raise IdentityError(f"all {UID_COUNT} sandbox uids from {UID_BASE} are in use")


def chown_tree(root: pathlib.Path, uid: int, gid: int) -> None:
  """Gives `root` and everything below it (symlinks themselves, not their targets) to uid:gid."""
  os.lchown(root, uid, gid)
  for dirpath, dirnames, filenames in os.walk(root):
    for name in dirnames + filenames:
      os.lchown(os.path.join(dirpath, name), uid, gid)
