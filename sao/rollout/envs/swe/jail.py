"""The bubblewrap command line of one sandboxed command: what it sees, and who it runs as.

What it sees: the system's `/usr`, `/bin`, `/lib*`, `/opt` and the Python installation read-only; from `/etc` only
what programs need to run (the dynamic loader's cache, alternatives, certificates, time zone, name-service
configuration: `ETC_ENTRIES`), with a synthetic `passwd`/`group` that list no host account — never `shadow`,
`sudoers`, ssh keys, package-manager credentials; a new `/proc` of its own PID namespace (`/proc/sys`,
`/proc/sysrq-trigger` read-only); a minimal `/dev`; size-limited tmpfs at `/tmp` and `/dev/shm`; and the episode's
repository at `/testbed`, the only writable host directory. Home directories and the project checkout are not
mounted.

Who it runs as: see `identity.py` (a dedicated unprivileged host uid when the trainer is root, else the trainer's
uid in a user namespace). Either way the command has no capabilities and cannot gain any (no-new-privs).
"""
from __future__ import annotations

import functools
import glob
import os
import subprocess

from sao.rollout.envs.swe import identity as identity_lib

WORKDIR = "/testbed"
# /etc entries commands need (others, e.g. shadow, gshadow, sudoers, ssh/, pip.conf, npmrc, machine-id, are hidden).
ETC_ENTRIES = ("alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ssl", "ca-certificates",
               "ca-certificates.conf", "pki", "crypto-policies", "localtime", "timezone", "nsswitch.conf", "host.conf",
               "hosts", "gai.conf", "protocols", "services", "networks", "mime.types", "magic", "magic.mime",
               "locale.alias", "locale.conf", "os-release", "lsb-release", "debian_version", "fonts", "matplotlibrc",
               "shells", "python3", "python3.*")
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt")


def _mirror(path: str) -> list[str]:
  """bwrap arguments that show host `path` read-only at the same place (a symlink stays a symlink)."""
  if os.path.islink(path):
    return ["--symlink", os.readlink(path), path]
  if os.path.exists(path):
    return ["--ro-bind", path, path]
  return []


def bwrap_argv(bwrap: str, identity: identity_lib.Identity, repo_dir: str, passwd_path: str, group_path: str,
               python_prefix: str, env: dict[str, str], script: str, tmp_bytes: int, shm_bytes: int,
               seccomp_fd: int | None) -> list[str]:
  """The full argv: bubblewrap, its namespaces and mounts, then (drop mode) setpriv, then `bash -c script`."""
  if identity.drop:
    # Root starts bwrap without a user namespace (one would map the sandbox to host root); bwrap keeps only the
    # capabilities setpriv needs to drop to the sandbox's uid, and setpriv clears them all.
    argv = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
  else:
    argv = [bwrap, "--unshare-all", "--unshare-user", "--uid", str(identity.uid), "--gid", str(identity.gid),
            "--cap-drop", "ALL"]
  argv += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
  if seccomp_fd is not None:
    argv += ["--seccomp", str(seccomp_fd)]
  for top in _SYSTEM_DIRS:
    argv += _mirror(top)
  argv += ["--dir", "/etc"]
  for pattern in ETC_ENTRIES:
    for path in sorted(glob.glob(os.path.join("/etc", pattern))):
      argv += _mirror(path)
  argv += ["--ro-bind", passwd_path, "/etc/passwd", "--ro-bind", group_path, "/etc/group"]
  if not python_prefix.startswith(tuple(d + "/" for d in _SYSTEM_DIRS)):
    parents = []
    parent = os.path.dirname(python_prefix)
    while parent != "/":
      parents.insert(0, parent)
      parent = os.path.dirname(parent)
    for parent in parents:  # traversable, whatever the host's modes (e.g. /root is 0700)
      argv += ["--perms", "0755", "--dir", parent]
    argv += ["--ro-bind", python_prefix, python_prefix]
  # bwrap's --proc covers /proc/sysrq-trigger, /proc/irq, /proc/bus (and /proc/sys, but only where bwrap itself
  # could write it) read-only; /proc/sys is bound read-only explicitly (bind sources resolve on the host side, so it
  # shows the host's values, as any host user can read them). The uid is unprivileged: sysctl writes fail anyway.
  argv += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys",
           "--dev", "/dev", "--perms", "1777", "--size", str(shm_bytes), "--tmpfs", "/dev/shm",
           "--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", "/tmp",
           "--bind", repo_dir, WORKDIR, "--chdir", WORKDIR, "--clearenv"]
  for k, v in env.items():
    argv += ["--setenv", k, v]
  argv.append("--")
  if identity.drop:
    argv += ["setpriv", f"--reuid={identity.uid}", f"--regid={identity.gid}", "--clear-groups",
             "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
  return argv + ["bash", "-c", script]


@functools.cache
def check_drop(bwrap: str) -> None:
  """Raises `IdentityError` unless root can run bwrap without a user namespace and drop to a sandbox uid there
  (a root without CAP_SYS_ADMIN, as in an unprivileged container, cannot): never a silent fallback."""
  uid = identity_lib.UID_BASE + identity_lib.UID_COUNT - 1
  argv = [bwrap, "--unshare-pid", "--unshare-net", "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add",
          "CAP_SETGID", "--cap-add", "CAP_SETPCAP", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--",
          "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--bounding-set=-all", "--no-new-privs",
          "--", "sh", "-c", "id -u"]
  try:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
  except (OSError, subprocess.TimeoutExpired) as e:
    raise identity_lib.IdentityError(f"cannot run {bwrap}: {e}") from e
  if proc.returncode != 0 or proc.stdout.strip() != str(uid):
    raise identity_lib.IdentityError(
        "the trainer runs as root, so sandboxed commands must drop to an unprivileged uid, but bwrap could not "
        f"(exit {proc.returncode}: {proc.stderr.strip()[-300:]}); root needs CAP_SYS_ADMIN to create the "
        "namespaces, or run the trainer as an ordinary user")
