"""Sandboxed commands are unprivileged on the host even when the trainer is root (as here and in CI): a host uid that
is not 0, no capabilities, no host secrets in view (also not through the editor), a read-only /proc/sys.

Nothing here writes to /proc/sys: writability is probed with access() and an open() for update that writes nothing.
"""
from __future__ import annotations

import fcntl
import json
import os
import pathlib

import pytest

from sao.rollout.envs.swe import identity
from sao.rollout.envs.swe.sandbox import Sandbox, SandboxConfig
from sao.rollout.envs.swe.tools import editor

EDITOR = f"python3 -I -S -c {__import__('shlex').quote(pathlib.Path(editor.__file__).read_text())}"
AS_ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def boxes(calc_dataset, tmp_path_factory):
  _, root, record = calc_dataset
  config = SandboxConfig(timeout_s=20, root=str(tmp_path_factory.mktemp("episodes")))
  a = Sandbox.create(root / "acme__calc", record["base_commit"], config)
  b = Sandbox.create(root / "acme__calc", record["base_commit"], config)
  yield a, b
  a.close()
  b.close()


def test_commands_run_as_an_unprivileged_host_identity(boxes):
  a, b = boxes
  result = a.run("id -u; id -G; grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status; "
                 "touch made_inside")
  lines = result.output.split()
  uid, groups, status = lines[0], lines[1:-12], dict(zip(lines[-12::2], lines[-11::2]))
  owner = os.stat(a.repo_dir / "made_inside")
  assert owner.st_uid != 0 and owner.st_gid != 0 and uid != "0" and "0" not in groups
  assert all(status[f"Cap{k}:"] == "0000000000000000" for k in ("Inh", "Prm", "Eff", "Bnd", "Amb"))
  assert status["NoNewPrivs:"] == "1"
  if AS_ROOT:
    # A uid of its own: the host sees the command as it, and the other sandbox has another.
    assert uid == str(owner.st_uid) == str(a.identity.uid) and a.identity.uid >= identity.UID_BASE
    assert a.identity.uid != b.identity.uid
    assert b.run("id -u").output.strip() == str(b.identity.uid)


def test_host_secrets_are_out_of_sight(boxes):
  a, _ = boxes
  for command in ("cat /etc/shadow", "cat /etc/gshadow", "ls /root/.ssh", "cat /etc/sudoers"):
    assert a.run(command).exit_code != 0, command
  assert not {"shadow", "gshadow", "sudoers"} & set(a.run("ls -a /etc").output.split())
  users = {line.split(":")[0] for line in a.run("cat /etc/passwd").output.splitlines()}
  assert users <= {"root", "sandbox", "nobody"}
  # The editor runs inside the sandbox, as the same unprivileged identity.
  for path in ("/etc/shadow", "/root/.bashrc") + (("/proc/1/environ",) if AS_ROOT else ()):
    out = a.run(EDITOR, stdin=json.dumps({"command": "view", "path": path}).encode()).output
    assert out.startswith("ERROR"), (path, out[:200])
  if AS_ROOT:
    # A root-only file inside the repository itself: mounted, yet unreadable, by the command and by the editor.
    secret = a.repo_dir / "root_only.txt"
    secret.write_text("hunter2\n")
    os.chown(secret, 0, 0)
    os.chmod(secret, 0o600)
    assert "hunter2" not in a.run("cat root_only.txt").output
    out = a.run(EDITOR, stdin=json.dumps({"command": "view", "path": "/testbed/root_only.txt"}).encode()).output
    assert out.startswith("ERROR") and "hunter2" not in out


def test_proc_sys_is_read_only(boxes):
  a, _ = boxes
  probe = ("import os\n"
           "for path in ('/proc/sys/kernel/core_pattern', '/proc/sys/kernel/modprobe', '/proc/sysrq-trigger'):\n"
           "  try:\n"
           "    open(path, 'r+b').close()\n"  # opening for update writes nothing
           "    print('OPENED', path)\n"
           "  except OSError as e:\n"
           "    print('refused', path, e.errno)\n"
           "  print('access', os.access(path, os.W_OK))\n")
  result = a.run(f"python -c \"{probe}\"; [ -w /proc/sys/kernel/core_pattern ] && echo WRITABLE; "
                 "grep ' /proc/sys ' /proc/self/mounts")
  assert "OPENED" not in result.output and "WRITABLE" not in result.output, result.output
  assert result.output.count("refused") == 3 and "access True" not in result.output
  mount = [line for line in result.output.splitlines() if " /proc/sys " in line]
  assert mount and mount[0].split()[3].split(",")[0] == "ro"


@pytest.mark.skipif(not AS_ROOT, reason="uid leases exist only when the trainer is root")
def test_uid_lease_is_released_on_close(calc_dataset, tmp_path):
  _, root, record = calc_dataset
  box = Sandbox.create(root / "acme__calc", record["base_commit"], SandboxConfig(root=str(tmp_path)))
  lock = pathlib.Path(identity._lock_dir()) / str(box.identity.uid)
  fd = os.open(lock, os.O_RDWR)
  try:
    with pytest.raises(BlockingIOError):
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by the live sandbox
    box.close()
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again
  finally:
    os.close(fd)
  assert not box.episode_dir.exists()
