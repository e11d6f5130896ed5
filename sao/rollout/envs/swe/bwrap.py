"""Finds or installs bubblewrap (`bwrap`), the Linux-namespace sandbox every SWE episode command runs in.

`ensure_bwrap()` is the project's own setup step (`python -m sao.rollout.envs.swe.bwrap` runs it ahead of a run):
it returns a working `bwrap` from `$SAO_BWRAP`, `PATH`, or the per-user cache (`~/.cache/sao/bwrap/`, or
`$SAO_CACHE_DIR/bwrap/`), and otherwise downloads Debian's `bubblewrap` package with `apt-get download` and unpacks
it there with `dpkg-deb -x` — into the user's cache only: nothing is installed on the host, no package list is
refreshed, nothing needs root. Every candidate is smoke-tested (a namespaced `true`), so a binary that exists but
cannot create namespaces on this kernel is a clear error, not a silent fallback to unsandboxed execution.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile
import struct
import threading

_LOCK = threading.Lock()


class BwrapUnavailableError(RuntimeError):
  """bubblewrap could not be found, installed, or run on this machine."""


def cache_dir() -> pathlib.Path:
  """The project's per-user cache root (`$SAO_CACHE_DIR`, else `~/.cache/sao`)."""
  root = os.environ.get("SAO_CACHE_DIR")
  return pathlib.Path(root) if root else pathlib.Path.home() / ".cache" / "sao"


_BUILD_LOCK = threading.Lock()


def cached_build(source: pathlib.Path, kind: str, build) -> pathlib.Path:
  """`cache_dir()/swe/<kind>/<key>`, built once from the file `source` (keyed by its resolved path, size and mtime):
  `build(staging)` fills an empty staging directory beside it, which is then renamed into place, so a failed or
  interrupted build leaves nothing behind. Exceptions of `build` propagate."""
  st = source.stat()
  key = hashlib.sha256(f"{source.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
  dest = cache_dir() / "swe" / kind / key
  with _BUILD_LOCK:
    if not dest.exists():
      dest.parent.mkdir(parents=True, exist_ok=True)
      staging = pathlib.Path(tempfile.mkdtemp(prefix=f"{kind}_", dir=dest.parent))
      try:
        build(staging)
        staging.rename(dest)
      finally:
        if staging.exists():
          shutil.rmtree(staging, ignore_errors=True)
  return dest


def _smoke_test(bwrap: str) -> str | None:
  """None if `bwrap` can build the namespaces the sandbox uses (and knows its options: `--size`, `--perms` need
  bubblewrap >= 0.5), else why not."""
  try:
    proc = subprocess.run(
        [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev",
         "--proc", "/proc", "--perms", "1777", "--size", str(1 << 20), "--tmpfs", "/tmp", "true"],
        capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.TimeoutExpired) as e:
    return f"{type(e).__name__}: {e}"
  if proc.returncode != 0:
    return f"exit {proc.returncode}: {proc.stderr.strip()[:500]}"
  return None


def _download(dest: pathlib.Path) -> None:
  """Downloads Debian's bubblewrap package and unpacks it under `dest` (so `dest/usr/bin/bwrap` exists)."""
  for tool in ("apt-get", "dpkg-deb"):
    if shutil.which(tool) is None:
      raise BwrapUnavailableError(
          f"bwrap is not on PATH and {tool!r} is missing, so it cannot be fetched; install bubblewrap "
          "(e.g. `apt-get install bubblewrap`) or set $SAO_BWRAP to its path")
  with tempfile.TemporaryDirectory(prefix="sao_bwrap_") as tmp:
    # Never `apt-get update` (it changes the host's package lists, as root): a host without lists must install
    # bubblewrap itself.
    proc = subprocess.run(["apt-get", "download", "bubblewrap"], cwd=tmp, capture_output=True, text=True,
                          timeout=300)
    debs = sorted(pathlib.Path(tmp).glob("bubblewrap_*.deb"))
    if proc.returncode != 0 or not debs:
      raise BwrapUnavailableError(
          f"`apt-get download bubblewrap` failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}; install "
          "bubblewrap or set $SAO_BWRAP")
    staging = pathlib.Path(tempfile.mkdtemp(prefix="bwrap_", dir=dest.parent))
    try:
      subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(staging)], check=True, capture_output=True, timeout=60)
      if dest.exists():
        shutil.rmtree(dest)
      staging.rename(dest)  # atomic: a concurrent process sees either no cache or a complete one
    finally:
      if staging.exists():
        shutil.rmtree(staging)


@functools.cache
def ensure_bwrap() -> str:
  """The path of a working `bwrap`, installing it into the cache on first use; raises `BwrapUnavailableError`."""
  with _LOCK:
    tried = []
    cached = cache_dir() / "bwrap" / "usr" / "bin" / "bwrap"
    for candidate in (os.environ.get("SAO_BWRAP"), shutil.which("bwrap"), str(cached) if cached.exists() else None):
      if candidate:
        problem = _smoke_test(candidate)
        if problem is None:
          return candidate
        tried.append(f"{candidate}: {problem}")
    if not cached.exists():
      cached.parents[2].parent.mkdir(parents=True, exist_ok=True)
      _download(cached.parents[2])
      problem = _smoke_test(str(cached))
      if problem is None:
        return str(cached)
      tried.append(f"{cached}: {problem}")
    raise BwrapUnavailableError(
        "no working bwrap (are unprivileged user namespaces enabled? try `unshare -Ur true`); tried: "
        + "; ".join(tried))


# seccomp: refuse to create IP, packet and vsock sockets (EACCES) — on top of the empty network namespace, so
# "opening a socket" fails outright rather than only connecting (vsock is not namespaced at all: a host with
# /dev/vsock would be reachable) — and refuse every system call of another ABI than the host's native one (ENOSYS:
# i386 `int 0x80` and x32 on x86_64, arm32 on aarch64), so no syscall number escapes the checks through another
# table. A classic-BPF program over `struct seccomp_data` (nr at offset 0, arch at 4, args[0] at 16), assembled
# here because bwrap takes it pre-compiled (`--seccomp FD`).
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_SYS_SOCKET = {"x86_64": 41, "aarch64": 198}
_X32_SYSCALL_BIT = 0x40000000
BLOCKED_DOMAINS = (2, 10, 17, 40)  # AF_INET, AF_INET6, AF_PACKET, AF_VSOCK (AF_UNIX stays: asyncio uses it)
_RET_ALLOW, _RET_EACCES, _RET_ENOSYS = 0x7FFF0000, 0x00050000 | 13, 0x00050000 | 38


def seccomp_program(machine: str | None = None) -> bytes:
  """The filter as bwrap reads it: an array of `struct sock_filter {u16 code; u8 jt, jf; u32 k;}`, for `machine`
  (default: this host's, `os.uname().machine`; x86_64 and aarch64 are known)."""
  machine = machine or os.uname().machine
  if machine not in _AUDIT_ARCH:
    raise BwrapUnavailableError(f"no seccomp filter for the {machine} architecture (known: {sorted(_AUDIT_ARCH)})")
  ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
  prog: list[tuple] = [("ld", 4), ("jeq", _AUDIT_ARCH[machine], None, "foreign"), ("ld", 0)]
  if machine == "x86_64":
    prog.append(("jge", _X32_SYSCALL_BIT, "foreign", None))
  prog += [("jeq", _SYS_SOCKET[machine], None, "allow"), ("ld", 16)]
  for domain in BLOCKED_DOMAINS:
    prog.append(("jeq", domain, "deny", None))
  prog += [("label", "allow"), ("ret", _RET_ALLOW), ("label", "deny"), ("ret", _RET_EACCES),
           ("label", "foreign"), ("ret", _RET_ENOSYS)]
  labels, pc = {}, 0
  for ins in prog:
    if ins[0] == "label":
      labels[ins[1]] = pc
    else:
      pc += 1
  out, pc = [], 0
  for ins in prog:
    if ins[0] == "label":
      continue
    if ins[0] in ("ld", "ret"):
      out.append(struct.pack("<HBBI", ld if ins[0] == "ld" else ret, 0, 0, ins[1]))
    else:
      op, k, yes, no = ins
      jt = 0 if yes is None else labels[yes] - pc - 1
      jf = 0 if no is None else labels[no] - pc - 1
      out.append(struct.pack("<HBBI", jeq if op == "jeq" else jge, jt, jf, k))
    pc += 1
  return b"".join(out)


if __name__ == "__main__":
  print(ensure_bwrap())
