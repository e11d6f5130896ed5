"""The sandbox is isolated: commands cannot write outside their episode, read another episode, or reach the network
— and after each refused attempt the episode goes on. Uses bubblewrap obtained by the project's own setup
(`ensure_bwrap`: PATH, cache, or Debian's package), never skipped."""
from __future__ import annotations

import os
import shutil
import socket
import threading

import pytest

from sao.rollout.envs.swe import bwrap
from sao.rollout.envs.swe.sandbox import Sandbox, SandboxConfig


@pytest.fixture(scope="module")
def pair(calc_dataset, tmp_path_factory):
  """Two live episodes of the same repository."""
  _, root, record = calc_dataset
  config = SandboxConfig(timeout_s=10, root=str(tmp_path_factory.mktemp("episodes")))
  a = Sandbox.create(root / "acme__calc", record["base_commit"], config)
  b = Sandbox.create(root / "acme__calc", record["base_commit"], config)
  yield a, b
  a.close()
  b.close()


def alive(box):
  result = box.run("echo alive && ls calc")
  assert result.exit_code == 0 and result.output.startswith("alive\n")


def test_bwrap_is_obtained_by_setup():
  """`ensure_bwrap` returns a working bwrap: from PATH, or installed by it into the project cache (on a clean
  machine, as in CI, it downloads Debian's package there; this run may find it cached)."""
  path = bwrap.ensure_bwrap()
  assert os.access(path, os.X_OK)
  if not shutil.which("bwrap") and not os.environ.get("SAO_BWRAP"):
    assert path == str(bwrap.cache_dir() / "bwrap" / "usr" / "bin" / "bwrap")


def test_writes_outside_the_episode_fail(pair, tmp_path):
  a, _ = pair
  target = tmp_path / "escaped.txt"
  for command in (f"echo x > {target}", "echo x > /etc/escaped", "echo x > /usr/escaped", f"mkdir {tmp_path}/d",
                  f"touch {a.episode_dir}/outside_repo"):
    result = a.run(command)
    assert result.exit_code != 0, command
  assert not target.exists() and not os.path.exists("/etc/escaped") and not (a.episode_dir / "outside_repo").exists()
  # /tmp inside is private and empty per command; the repository itself is writable.
  assert a.run("echo x > /tmp/t && cat /tmp/t").output == "x\n"
  assert a.run("echo y > inside.txt").exit_code == 0 and (a.repo_dir / "inside.txt").read_text() == "y\n"
  alive(a)


def test_other_episodes_and_host_files_are_invisible(pair, monkeypatch):
  a, b = pair
  (b.repo_dir / "secret_of_b.txt").write_text("b's secret\n")
  for command in (f"cat {b.repo_dir}/secret_of_b.txt", f"ls {b.episode_dir}", f"ls {b.episode_dir.parent}",
                  "ls /home", f"cat {os.path.abspath(__file__)}"):
    result = a.run(command)
    assert "b's secret" not in result.output and result.exit_code != 0, command
  # Nor is the host's environment, not even through the sandbox's init process.
  monkeypatch.setenv("SAO_TEST_SECRET", "hunter2")
  result = a.run("env; cat /proc/*/environ")
  assert "hunter2" not in result.output and "SAO_TEST_SECRET" not in result.output
  assert b.run("cat secret_of_b.txt").output == "b's secret\n"
  alive(a)


def test_network_is_unreachable(pair):
  a, _ = pair
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen(1)
  port = server.getsockname()[1]
  accepted = []

  def accept():
    try:
      accepted.append(server.accept())
    except OSError:
      pass  # closed at the end of the test, never having accepted anything

  threading.Thread(target=accept, daemon=True).start()
  try:
    probe = ("import socket, sys\n"
             "for host, port in (('127.0.0.1', {port}), ('8.8.8.8', 53), ('1.1.1.1', 443)):\n"
             "  try:\n"
             "    socket.create_connection((host, port), timeout=2)\n"
             "    print('connected', host)\n"
             "  except OSError as e:\n"
             "    print('refused', host, e.errno)\n").format(port=port)
    result = a.run(f"python -c \"{probe}\"")
    assert "connected" not in result.output and result.output.count("refused") == 3, result.output
    assert not accepted  # the host's listener never saw the sandbox
    # Creating an IP socket at all is refused (seccomp); Unix sockets, which asyncio needs, still work.
    result = a.run("python -c 'import socket; socket.socket()'")
    assert result.exit_code != 0 and "PermissionError" in result.output
    assert a.run("python -c 'import asyncio; asyncio.run(asyncio.sleep(0)); print(1)'").output == "1\n"
  finally:
    server.close()
  alive(a)


def test_limits_time_memory_privileges(pair):
  a, _ = pair
  result = a.run("sleep 60 & sleep 60", timeout_s=1)
  assert result.timed_out and result.duration_s < 5
  result = a.run("python -c 'x = bytearray(8 << 30)'")  # over the address-space limit
  assert result.exit_code != 0 and "MemoryError" in result.output
  result = a.run("id -u; grep CapEff /proc/self/status; mount -t tmpfs none /usr 2>&1; ulimit -v unlimited 2>&1")
  lines = result.output.splitlines()
  assert lines[0] != "0" and lines[1].split()[1] == "0000000000000000"
  assert "mount" in result.output and "ulimit" in result.output  # both refused
  alive(a)


def test_unsandboxed_only_when_configured(calc_dataset, tmp_path):
  _, root, record = calc_dataset
  with pytest.raises(ValueError, match="isolation"):
    SandboxConfig(isolation="off")
  with Sandbox.create(root / "acme__calc", record["base_commit"], SandboxConfig(isolation="none")) as box:
    assert box.run("pwd").output.strip() == str(box.repo_dir)  # no namespaces: the real path
