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

Kernel objects that outlive a process are keyed by uid or namespace; none may cross from one episode to another:
  - keyrings: a uid's user keyrings (`@u`, `@us`) live as long as the uid has keys, so they are cleared whenever a
    uid is leased (`clear_keyrings`, run as that uid), and each command starts in a fresh anonymous session keyring
    (`SESSION_KEYRING_SHIM`), never the trainer's. In user-namespace mode every sandbox has its own user namespace,
    and user keyrings are per user namespace (Linux >= 5.3).
  - grading never runs model code under a uid an agent later gets: the range is split into an agent half and a
    grader half (`lease(pool=...)`).
  - SysV IPC and abstract unix sockets belong to the IPC and network namespaces each command gets afresh.

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
POOLS = {"agent": (UID_BASE, UID_COUNT // 2), "grader": (UID_BASE + UID_COUNT // 2, UID_COUNT // 2)}
INSIDE_UID = 1000  # the uid commands see in user-namespace mode
_KEYCTL_NR = {"x86_64": 250, "aarch64": 219}
# KEYCTL_CLEAR (7) of KEY_SPEC_USER_KEYRING (-4) and KEY_SPEC_USER_SESSION_KEYRING (-5), as the uid itself.
_CLEAR_SOURCE = ("import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
                 "for ring in (-4, -5):\n"
                 "    if libc.syscall(ctypes.c_long({nr}), ctypes.c_long(7), ctypes.c_long(ring)) < 0:\n"
                 "        sys.exit(f'keyctl clear {{ring}}: errno {{ctypes.get_errno()}}')\n")
# KEYCTL_JOIN_SESSION_KEYRING (1) with no name: a new anonymous session keyring, then the command. Python ignores
# SIGPIPE and SIGXFSZ, and ignored signals survive exec: the command gets them back at their defaults (a pipe reader
# that quits ends its writer; `ulimit -f` kills).
SESSION_KEYRING_SHIM = ("import ctypes, os, signal, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                        "libc.syscall.restype = ctypes.c_long\n"
                        "if libc.syscall(ctypes.c_long({nr}), ctypes.c_long(1), None) < 0:\n"
                        "    sys.exit('sandbox: cannot start a fresh session keyring')\n"
                        "for sig in (signal.SIGPIPE, signal.SIGXFSZ):\n"
                        "    signal.signal(sig, signal.SIG_DFL)\n"
                        "os.execvp(sys.argv[1], sys.argv[1:])\n")


def keyctl_number() -> int:
  """The keyctl system call's number on this host."""
  machine = os.uname().machine
  if machine not in _KEYCTL_NR:
    raise IdentityError(f"no keyctl system call number known for {machine}")
  return _KEYCTL_NR[machine]


def clear_keyrings(uid: int, python: str) -> None:
  """Empties `uid`'s user and user-session keyrings (what an earlier sandbox of that uid left there)."""
  import subprocess
  argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", python, "-I", "-S", "-c",
          _CLEAR_SOURCE.format(nr=keyctl_number())]
  proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
  if proc.returncode != 0:
    raise IdentityError(f"cannot clear the keyrings of uid {uid}: {proc.stderr.strip()[-300:]}")


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


def lease(pool: str = "agent", python: str = "python3") -> Identity:
  """The identity of a new sandbox; when the trainer is root, the lowest free uid of `pool`'s half of the range
  ("agent" or "grader"), unique host-wide while leased (release it with `release`), its keyrings cleared. Reusing
  uids keeps the lock directory as small as the concurrency."""
  if pool not in POOLS:
    raise ValueError(f"pool: {pool!r} is not one of {sorted(POOLS)}")
  if os.geteuid() != 0:
    return Identity(uid=INSIDE_UID, gid=INSIDE_UID, drop=False)
  if shutil.which("setpriv") is None:
    raise IdentityError("the trainer runs as root, so sandboxed commands must drop to an unprivileged uid, which "
                        "needs `setpriv` (util-linux) on PATH; install it")
  directory = _lock_dir()
  first, count = POOLS[pool]
  for uid in range(first, first + count):
    fd = os.open(directory / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      os.close(fd)
      continue
    identity = Identity(uid=uid, gid=uid, drop=True, _lock_fd=fd)
    try:
      clear_keyrings(uid, python)
    except BaseException:
      identity.release()
      raise
    return identity
  raise IdentityError(f"all {count} {pool} sandbox uids from {first} are in use")


def chown_tree(root: pathlib.Path, uid: int, gid: int) -> None:
  """Gives `root` and everything below it (symlinks themselves, not their targets) to uid:gid."""
  os.lchown(root, uid, gid)
  for dirpath, dirnames, filenames in os.walk(root):
    for name in dirnames + filenames:
      os.lchown(os.path.join(dirpath, name), uid, gid)
