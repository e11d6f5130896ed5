"""Finds or installs bubblewrap (`bwrap`), the Linux-namespace sandbox every SWE episode command runs in.

`ensure_bwrap()` is the project's own setup step: it returns a working `bwrap` from `$SAO_BWRAP`, `PATH`, or the
per-user cache (`~/.cache/sao/bwrap/`, or `$SAO_CACHE_DIR/bwrap/`), and otherwise downloads Debian's `bubblewrap`
package with `apt-get download` and unpacks it there with `dpkg-deb -x` (no root needed; unprivileged user
namespaces do the isolating). Every candidate is smoke-tested (a namespaced `true`), so a binary that exists but
cannot create namespaces on this kernel is a clear error, not a silent fallback to unsandboxed execution.
"""
from __future__ import annotations

import functools
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
    cmd = ["apt-get", "download", "bubblewrap"]
    proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and os.geteuid() == 0:
      # A fresh container often ships without package lists; as root we may refresh them and retry once.
      update = subprocess.run(["apt-get", "update", "-qq"], capture_output=True, text=True, timeout=600)
      if update.returncode != 0:
        raise BwrapUnavailableError(f"`apt-get update` failed (exit {update.returncode}): {update.stderr[-500:]}")
      proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300)
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


# seccomp: refuse to create IP and packet sockets (EACCES) — on top of the empty network namespace, so "opening a
# socket" fails outright rather than only connecting. A classic-BPF program over `struct seccomp_data`
# (nr at offset 0, arch at 4, args[0] at 16), assembled here because bwrap takes it pre-compiled (`--seccomp FD`).
_AUDIT_ARCH_X86_64, _AUDIT_ARCH_AARCH64 = 0xC000003E, 0xC00000B7
_SYS_SOCKET = {_AUDIT_ARCH_X86_64: (41, 0x40000000 | 41), _AUDIT_ARCH_AARCH64: (198,)}  # x86_64 also via x32
_BLOCKED_DOMAINS = (2, 10, 17)  # AF_INET, AF_INET6, AF_PACKET (AF_UNIX stays: asyncio, multiprocessing use it)
_RET_ALLOW, _RET_EACCES = 0x7FFF0000, 0x00050000 | 13


def seccomp_program() -> bytes:
  """The filter as bwrap reads it: an array of `struct sock_filter {u16 code; u8 jt, jf; u32 k;}`."""
  ld, jeq, ret = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
  prog: list[tuple] = [("ld", 4)]  # symbolic: jumps name labels, resolved below
  archs = list(_SYS_SOCKET)
  for i, arch in enumerate(archs):
    prog.append(("jeq", arch, f"arch{i}", "allow" if i == len(archs) - 1 else None))
  for i, arch in enumerate(archs):
    prog += [("label", f"arch{i}"), ("ld", 0)]
    numbers = _SYS_SOCKET[arch]
    for j, nr in enumerate(numbers):
      prog.append(("jeq", nr, "domain", "allow" if j == len(numbers) - 1 else None))
  prog += [("label", "domain"), ("ld", 16)]
  for j, domain in enumerate(_BLOCKED_DOMAINS):
    prog.append(("jeq", domain, "deny", "allow" if j == len(_BLOCKED_DOMAINS) - 1 else None))
  prog += [("label", "allow"), ("ret", _RET_ALLOW), ("label", "deny"), ("ret", _RET_EACCES)]
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
    if ins[0] == "ld":
      out.append(struct.pack("<HBBI", ld, 0, 0, ins[1]))
    elif ins[0] == "ret":
      out.append(struct.pack("<HBBI", ret, 0, 0, ins[1]))
    else:
      _, k, yes, no = ins
      jt = labels[yes] - pc - 1
      jf = 0 if no is None else labels[no] - pc - 1
      out.append(struct.pack("<HBBI", jeq, jt, jf, k))
    pc += 1
  return b"".join(out)
