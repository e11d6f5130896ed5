"""Starts the local JAX engine as a child process (`python -m sao.engines.serve`) and waits until it serves.

The engine itself is `sao.engines.local_engine` (batching core) behind `sao.engines.http_app` (SGLang's HTTP API);
the process handling (own process group, parent-death signal, log tails in errors) is `processes.ChildProcess`.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
import urllib.request
from typing import Mapping, Sequence

from sao.engines import processes

READY_PREFIX = "SAO_ENGINE_READY url="


class LocalEngineProcess(processes.ChildProcess):
  """A `python -m sao.engines.serve` child process with the URL it serves on; `stop()` (or the context manager)
  ends it and everything it started."""
  url: str = ""


def _ready_url(log_text: str) -> str:
  """The URL of the engine's ready line in its log, or "" before it printed one."""
  for line in log_text.splitlines():
    if line.startswith(READY_PREFIX):
      return line[len(READY_PREFIX):].strip()
  return ""


def _health_ok(url: str) -> bool:
  try:
    with urllib.request.urlopen(url + "/health", timeout=5) as resp:
      return resp.status == 200
  except OSError:
    return False


def start_local_engine(model_path: str, port: int = 0, host: str = "127.0.0.1", *,
                       engine_args: Sequence[str] = (), startup_timeout_s: float = 180.0,
                       env: Mapping[str, str] | None = None,
                       log_path: str | None = None, name: str = "engine") -> tuple[LocalEngineProcess, str]:
  """Spawns `python -m sao.engines.serve --model_path=... --port=...` and waits for its ready line and `/health`.

  `engine_args` are extra serve flags (`--max_batch_size=1`, `--batch_window_ms=2`, ...). The server's stdout and
  stderr go to `log_path` (a temp file by default, truncated first: an old ready line would be read as the new URL;
  its tail is in any startup error). Returns (process, url); raises `processes.ChildError` if the engine exits
  before it is ready and TimeoutError after `startup_timeout_s`, with the engine stopped.
  """
  if log_path is None:
    fd, log_path = tempfile.mkstemp(prefix="sao-engine-", suffix=".log")
    os.close(fd)
  cmd = [sys.executable, "-m", "sao.engines.serve", f"--model_path={model_path}", f"--port={port}", f"--host={host}",
         *engine_args]
  handle = LocalEngineProcess(name, cmd, log_path, env=env, fresh_log=True, stop_timeout_s=10.0)
  handle.start()
  try:
    deadline = time.monotonic() + startup_timeout_s
    handle.url = handle.wait_ready(lambda: _ready_url(handle.log_tail(1 << 20)), startup_timeout_s)
    handle.wait_ready(lambda: _health_ok(handle.url), max(deadline - time.monotonic(), 0.0))
    return handle, handle.url
  except BaseException:
    handle.stop()
    raise
