"""Starts the local JAX engine as a subprocess (`python -m sao.engines.serve`) and waits until it serves.

The engine itself is `sao.engines.local_engine` (batching core) behind `sao.engines.http_app` (SGLang's HTTP API).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any, Mapping, Sequence

from sao.engines import lifetime

READY_PREFIX = "SAO_ENGINE_READY url="


# ---- subprocess launcher ----------------------------------------------------------------------------------------

class LocalEngineProcess:
  """A `python -m sao.engines.serve` subprocess; `stop()` (or the context manager) terminates it."""

  def __init__(self, process: subprocess.Popen, url: str, log_path: str):
    self.process = process
    self.url = url
    self.log_path = log_path

  def log_tail(self, n_chars: int = 4000) -> str:
    try:
      with open(self.log_path, errors="replace") as f:
        return f.read()[-n_chars:]
    except OSError as e:
      return f"(log {self.log_path} unreadable: {e})"

  def alive(self) -> bool:
    return self.process.poll() is None

  def stop(self, timeout_s: float = 10.0) -> None:
    if self.process.poll() is None:
      self.process.terminate()
      try:
        self.process.wait(timeout_s)
      except subprocess.TimeoutExpired:
        self.process.kill()
        self.process.wait(timeout_s)

  def __enter__(self) -> LocalEngineProcess:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.stop()


def start_local_engine(model_path: str, port: int = 0, host: str = "127.0.0.1", *,
                       engine_args: Sequence[str] = (), startup_timeout_s: float = 180.0,
                       env: Mapping[str, str] | None = None,
                       log_path: str | None = None) -> tuple[LocalEngineProcess, str]:
  """Spawns `python -m sao.engines.serve --model_path=... --port=...` and waits for its ready line and `/health`.

  `engine_args` are extra serve flags (`--max_batch_size=1`, `--batch_window_ms=2`, ...). The server's stdout and
  stderr go to `log_path` (a temp file by default; its tail is in any startup error). Returns (process, url).
  """
  if log_path is None:
    fd, log_path = tempfile.mkstemp(prefix="sao-engine-", suffix=".log")
    os.close(fd)
  cmd = [sys.executable, "-m", "sao.engines.serve", f"--model_path={model_path}", f"--port={port}", f"--host={host}",
         *engine_args]
  with open(log_path, "wb") as log_file:
    process = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               env=lifetime.child_env(env))
  handle = LocalEngineProcess(process, "", log_path)
  deadline = time.monotonic() + startup_timeout_s
  try:
    while not handle.url:
      if process.poll() is not None:
        raise RuntimeError(f"engine exited with code {process.returncode} before it was ready; log tail:\n"
                           f"{handle.log_tail()}")
      if time.monotonic() > deadline:
        raise TimeoutError(f"engine not ready within {startup_timeout_s}s; log tail:\n{handle.log_tail()}")
      for line in handle.log_tail(1 << 20).splitlines():
        if line.startswith(READY_PREFIX):
          handle.url = line[len(READY_PREFIX):].strip()
      time.sleep(0.05)
    while True:
      try:
        with urllib.request.urlopen(handle.url + "/health", timeout=5) as resp:
          if resp.status == 200:
            return handle, handle.url
      except OSError as e:
        if time.monotonic() > deadline:
          raise TimeoutError(f"engine {handle.url}/health not answering: {e}; log tail:\n{handle.log_tail()}") from e
      time.sleep(0.05)
  except BaseException:
    handle.stop()
    raise
