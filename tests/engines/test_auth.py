"""The bind rule: loopback needs no token; any other interface refuses to start without one."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sao.engines import auth


@pytest.mark.parametrize("host,loopback", [("127.0.0.1", True), ("127.8.0.1", True), ("localhost", True),
                                           ("::1", True), ("[::1]", True), ("0.0.0.0", False), ("", False),
                                           ("::", False), ("10.0.0.5", False), ("engine.example", False)])
def test_is_loopback(host, loopback):
  assert auth.is_loopback(host) is loopback
  if loopback:
    auth.require_token_for_bind(host, None, "x")
  else:
    with pytest.raises(ValueError, match=f"x: refusing to bind non-loopback host {host!r} without a token"):
      auth.require_token_for_bind(host, None, "x")
  auth.require_token_for_bind(host, "t", "x")


def serve(*args: str, api_key_env: str | None = None) -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items() if k != auth.API_KEY_ENV}
  if api_key_env is not None:
    env[auth.API_KEY_ENV] = api_key_env
  return subprocess.run([sys.executable, "-m", "sao.engines.serve", "--model_path=/nonexistent/model", *args],
                        capture_output=True, text=True, env=env, timeout=120, check=False)


def test_engine_server_refuses_a_public_bind_without_a_token():
  """Checked before the model loads, so nothing binds; with a token (here from the environment) it gets as far as
  loading the (missing) model."""
  refused = serve("--host=0.0.0.0", "--port=0")
  assert refused.returncode != 0 and "refusing to bind non-loopback host '0.0.0.0' without a token" in refused.stderr
  started = serve("--host=0.0.0.0", "--port=0", api_key_env="t")
  assert started.returncode != 0 and "refusing" not in started.stderr
  assert "/nonexistent/model" in started.stderr, started.stderr[-2000:]
