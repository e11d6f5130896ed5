"""Sandboxes share nothing: no kernel object crosses from one episode to another (keyrings), grading never runs under
an agent's uid, the seccomp filter covers foreign syscall ABIs and AF_VSOCK, an inode budget beside the byte
budget. Probes in `probes/` run inside real sandboxes; a check the host cannot make is skipped with its reason."""
from __future__ import annotations

import ast
import asyncio
import os
import pathlib
import shlex
import subprocess

import pytest

from sao.rollout.envs.swe import bwrap, identity
from sao.rollout.envs.swe.sandbox import Sandbox, SandboxConfig

PROBES = pathlib.Path(__file__).parent / "probes"
AS_ROOT = os.geteuid() == 0


def _probe(box: Sandbox, name: str, *args: str) -> dict:
  result = box.run(f"python3 -c {shlex.quote((PROBES / name).read_text())} {' '.join(args)}")
  assert result.exit_code == 0, result.output
  return ast.literal_eval(result.output.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def calc_repo(calc_dataset, tmp_path_factory):
  _, root, record = calc_dataset
  return root / "acme__calc", record["base_commit"], SandboxConfig(timeout_s=20,
                                                                   root=str(tmp_path_factory.mktemp("episodes")))


def test_seccomp_refuses_foreign_abis_and_vsock(calc_repo):
  if os.uname().machine != "x86_64":
    pytest.skip("the probe's machine code is x86_64")
  source, base, config = calc_repo
  with Sandbox.create(source, base, config) as box:
    inside = _probe(box, "abi_probe.py")
  assert inside["vsock"] == -13, inside                       # EACCES, whether or not the host has /dev/vsock
  assert inside["i386"] == -38 and inside["x32"] == -38, inside  # ENOSYS: no syscall of another ABI runs
  assert bwrap.seccomp_program("aarch64") != bwrap.seccomp_program("x86_64")
  with pytest.raises(bwrap.BwrapUnavailableError, match="riscv64"):
    bwrap.seccomp_program("riscv64")


def test_keyrings_do_not_cross_episodes(calc_repo):
  """Attack 5: a key stored in every keyring a command can reach is gone for the next holder of the same uid."""
  source, base, config = calc_repo
  with Sandbox.create(source, base, config) as first:
    stored = _probe(first, "keys_probe.py", "put")
    assert all(v > 0 for v in stored.values()), stored
    assert _probe(first, "keys_probe.py", "get")[-3] < 0  # a new command: a new session keyring
    uid = first.identity.uid
  if not AS_ROOT:  # every sandbox has a user namespace, and with it user keyrings of its own
    with Sandbox.create(source, base, config) as second:
      assert all(v < 0 for v in _probe(second, "keys_probe.py", "get").values())
    return
  # Lease until the same uid comes back (the lowest free one; other processes may hold some meanwhile).
  held = []
  try:
    while not held or held[-1].uid != uid:
      held.append(identity.lease())
      assert len(held) < 1000, "the uid never came back"
    python = os.path.join(os.path.realpath(__import__("sys").base_prefix), "bin", "python3")
    proc = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", python,
                           str(PROBES / "keys_probe.py"), "get"], capture_output=True, text=True, timeout=30)
    found = ast.literal_eval(proc.stdout.strip())
  finally:
    for lease in held:
      lease.release()
  assert all(v < 0 for v in found.values()), found


@pytest.mark.skipif(not AS_ROOT, reason="uid pools are leased only when the trainer is root (else: a user "
                                        "namespace per sandbox)")
def test_grading_never_runs_under_an_agent_uid(calc_repo):
  source, base, config = calc_repo
  with Sandbox.create(source, base, config) as agent, Sandbox.create(source, base, config, pool="grader") as grader:
    first, count = identity.POOLS["agent"]
    assert first <= agent.identity.uid < first + count
    first, count = identity.POOLS["grader"]
    assert first <= grader.identity.uid < first + count


def test_inodes_have_a_budget_beside_bytes(calc_repo):
  """Symlinks cost next to no bytes but an inode each: past `max_inodes` new ones the command is killed and the
  sandbox is spent, as past `disk_mb`."""
  source, base, _ = calc_repo
  config = SandboxConfig(timeout_s=60, max_inodes=2000, disk_check_s=0.2)
  with Sandbox.create(source, base, config) as box:
    assert box.run("mkdir links && for i in $(seq 1000); do ln -s /nowhere links/$i; done").limit == ""
    result = box.run("for i in $(seq 1001 50000); do ln -s /nowhere links/$i; done")
    assert result.limit == "disk" and box.spent == "disk", result.observation()[-300:]


def test_memory_is_bounded_per_sandbox_memfds_included(calc_repo):
  """Four memfds (no address space, no /tmp) past `sandbox_memory_mb`: the kernel kills the command inside its
  sandbox's memory cgroup; under the bound the same writes succeed."""
  source, base, _ = calc_repo
  config = SandboxConfig(timeout_s=60, sandbox_memory_mb=192)
  with Sandbox.create(source, base, config) as box:
    if not box.memory_bound:
      pytest.skip("this host lets the trainer create no memory cgroup: only the per-process ulimit bounds memory")
    probe = shlex.quote((PROBES / "memfd_probe.py").read_text())
    under = box.run(f"python3 -c {probe} 64")
    assert under.exit_code == 0 and "done 64 MiB" in under.output, under.observation()[-300:]
    over = box.run(f"python3 -c {probe} 1000")
    assert over.exit_code != 0 and "done" not in over.output, over.observation()[-300:]
    written = [int(line.split()[1]) for line in over.output.splitlines() if line.startswith("wrote ")]
    assert max(written) < 192, written
    assert box.run("echo alive").output.strip() == "alive"  # the sandbox itself goes on


def test_sysv_ipc_and_abstract_sockets_are_not_shared(calc_repo):
  """While one sandbox holds a SysV segment and an abstract unix socket, another cannot reach either (each command
  has IPC and network namespaces of its own); the holder itself can, which shows the probe works."""
  source, base, config = calc_repo
  probe = shlex.quote((PROBES / "ipc_probe.py").read_text())

  async def run(holder, other):
    hold = asyncio.ensure_future(holder.arun(f"python3 -c {probe} hold 8 & sleep 2; python3 -c {probe} look; wait"))
    await asyncio.sleep(3)
    look = await other.arun(f"python3 -c {probe} look")
    return await hold, look

  with Sandbox.create(source, base, config) as holder, Sandbox.create(source, base, config) as other:
    hold, look = asyncio.run(run(holder, other))
  held, same = (ast.literal_eval(line) for line in hold.output.strip().splitlines()[:2])
  assert held["shm"] >= 0 and same["shm"] >= 0 and same["socket"] == 0, hold.output
  found = ast.literal_eval(look.output.strip().splitlines()[-1])
  assert found["shm"] == -2 and found["socket"] == -111, found  # ENOENT, ECONNREFUSED


def test_commands_start_with_default_signal_dispositions(calc_repo):
  """The keyring shim is Python, which ignores SIGPIPE and SIGXFSZ; the command must not inherit that: `yes | head`
  ends quietly, and writing past `ulimit -f` kills the writer (SIGXFSZ) rather than failing its write."""
  source, base, _ = calc_repo
  with Sandbox.create(source, base, SandboxConfig(timeout_s=20, file_mb=1)) as box:
    piped = box.run("yes | head -1; echo \"${PIPESTATUS[0]}\"")
    assert piped.output.split() == ["y", "141"], piped.output  # 128 + SIGPIPE
    big = box.run("head -c 3000000 /dev/zero > big; echo $?")
    assert big.output.strip().splitlines()[-1] == "153", big.output  # 128 + SIGXFSZ
