"""Builds the native kernels (`sao/kernels/*.cc`) with the host's C++ compiler and registers them with XLA.

A kernel is an XLA FFI handler (`jax.ffi`): a C++ function XLA:CPU calls in place of a custom call. It is compiled
the first time a process asks for it, against the FFI headers of the installed jaxlib (`jax.ffi.include_dir()`),
with `-O3 -march=native` for the machine that runs it, and kept in a per-user cache
(`$SAO_CACHE_DIR/kernels`, else `$XDG_CACHE_HOME/sao/kernels`, i.e. `~/.cache/sao/kernels`). The file's name
carries a hash of everything that shapes the binary (the source, the flags, the compiler's version, the jaxlib
version, the CPU's model and flags), so a changed source, compiler or machine is a new build, never a stale one. A
build is written to a temporary name and renamed into place: processes that build at once each finish their own
copy and the last rename wins, with the same bytes.

`SAO_NATIVE_KERNELS` chooses: `auto` (the default) uses a kernel where it builds and logs once why not where it
does not (no compiler, an old one); `on` makes a failed build an error; `off` never builds (the XLA formulations
run instead). `CXX` names the compiler (default `c++`).
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading

import jax
import jaxlib

from sao import env_choice

ENV = "SAO_NATIVE_KERNELS"
AUTO, ON, OFF = "auto", "on", "off"
_MEANINGS = {AUTO: "use the native kernels where they build", ON: "a failed build is an error",
             OFF: "never build them"}
FLAGS = ("-std=c++17", "-O3", "-march=native", "-fPIC", "-shared", "-w")
_SOURCE_DIR = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_loaded: dict[str, object] = {}  # kernel name and extra flags -> the loaded library, or its BuildError


class BuildError(RuntimeError):
  """A native kernel could not be compiled or loaded; the message carries the command and the compiler's output."""


def mode(env: dict[str, str] | None = None) -> str:
  """`auto`, `on` or `off` from `SAO_NATIVE_KERNELS`; ValueError naming the variable otherwise."""
  return env_choice.read(ENV, _MEANINGS, AUTO, env)


def cache_dir() -> str:
  """`$SAO_CACHE_DIR/kernels`, else `$XDG_CACHE_HOME/sao/kernels`, else `~/.cache/sao/kernels`."""
  if os.environ.get("SAO_CACHE_DIR"):
    return os.path.join(os.environ["SAO_CACHE_DIR"], "kernels")
  return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                      "sao", "kernels")


def _cpu_identity() -> str:
  """The CPU's model name and feature flags (what `-march=native` compiles for), from /proc/cpuinfo where it
  exists, else `platform.processor()`."""
  try:
    with open("/proc/cpuinfo") as f:
      lines = [line for line in f if line.startswith(("model name", "flags", "Features", "CPU part"))]
    return "".join(sorted(set(lines)))
  except OSError:
    return platform.processor() or platform.machine()


def _compiler() -> list[str]:
  compiler = os.environ.get("CXX", "c++").split()
  if not compiler or shutil.which(compiler[0]) is None:
    raise BuildError(f"no C++ compiler: {compiler[0] if compiler else 'CXX'!r} not found on PATH (set CXX, or "
                     f"{ENV}={OFF} to run the XLA formulations without native kernels)")
  return compiler


def _compiler_version(compiler: list[str]) -> str:
  result = subprocess.run([*compiler, "--version"], capture_output=True, text=True, check=False)
  if result.returncode != 0:
    raise BuildError(f"{' '.join(compiler)} --version failed: {result.stderr.strip()}")
  return result.stdout


def library_path(name: str, extra_flags: tuple[str, ...] = ()) -> str:
  """Compiles `sao/kernels/<name>.cc` (with `FLAGS` and `extra_flags`) unless a build of it for this host is cached;
  returns the shared library's path. Raises BuildError with the compiler's output when the build fails."""
  source = os.path.join(_SOURCE_DIR, f"{name}.cc")
  with open(source, "rb") as f:
    code = f.read()
  compiler = _compiler()
  include = jax.ffi.include_dir()
  key = hashlib.sha256(b"\0".join([
      code, " ".join(FLAGS + tuple(extra_flags)).encode(), " ".join(compiler).encode(), _compiler_version(compiler).encode(),
      jax.__version__.encode(), jaxlib.__version__.encode(),
      include.encode(), _cpu_identity().encode()])).hexdigest()[:20]
  directory = cache_dir()
  path = os.path.join(directory, f"{name}-{key}.so")
  if os.path.exists(path):
    return path
  os.makedirs(directory, exist_ok=True)
  fd, partial = tempfile.mkstemp(prefix=f".{name}-", suffix=".so", dir=directory)
  os.close(fd)
  command = [*compiler, *FLAGS, *extra_flags, f"-I{include}", source, "-o", partial]
  try:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
      raise BuildError(f"building the native kernel {name!r} failed ({' '.join(command)}):\n"
                       f"{result.stderr.strip()[-4000:]}")
    os.replace(partial, path)
  finally:
    if os.path.exists(partial):
      os.remove(partial)
  return path


def load(name: str, targets: dict[str, str], extra_flags: tuple[str, ...] = ()) -> None:
  """Builds `name` (`library_path`) and registers each `{XLA target name: exported symbol}` of it as a CPU FFI
  target, once per process and build; raises BuildError (the same one on every later call) when that failed."""
  key = " ".join((name, *extra_flags))
  with _lock:
    loaded = _loaded.get(key)
    if loaded is None:
      try:
        library = ctypes.CDLL(library_path(name, tuple(extra_flags)))
        for target, symbol in targets.items():
          jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
        loaded = library
      except (BuildError, OSError, AttributeError) as error:
        loaded = error if isinstance(error, BuildError) else BuildError(f"loading the native kernel {name!r}: {error}")
      _loaded[key] = loaded
  if isinstance(loaded, BuildError):
    raise loaded


_warned: set[str] = set()


def available(name: str, targets: dict[str, str]) -> bool:
  """Whether kernel `name` is built and registered, building it if needed, as `SAO_NATIVE_KERNELS` says: `off`
  gives False without building; `auto` logs a failed build once (a warning with the compiler's output) and gives
  False; `on` raises it."""
  chosen = mode()
  if chosen == OFF:
    return False
  try:
    load(name, targets)
    return True
  except BuildError as error:
    if chosen == ON:
      raise
    if name not in _warned:
      _warned.add(name)
      logging.warning("native kernel %r unavailable, using the XLA formulation instead (%s=%s to silence, =%s to "
                      "make this an error): %s", name, ENV, OFF, ON, error)
    return False
