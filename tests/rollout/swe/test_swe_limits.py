"""Per-episode limits: processes, repository growth, /tmp size — hitting one ends the command (and, for the disk,
the episode) with a clear status, never the host. And with isolation "none" a `setsid` child holding the output
cannot make `run()` outlive its timeout."""
from __future__ import annotations

import glob
import threading

import pytest

from sao.rollout import envs
from sao.rollout.envs.swe.sandbox import Sandbox, SandboxConfig, SandboxError
from sao.rollout.tool_format import ToolCall

# Forks (at most 200) children that sleep, until fork fails; prints how many it made.
FORKER = ("import os, time\n"
          "n = 0\n"
          "try:\n"
          "  for _ in range(200):\n"
          "    if os.fork() == 0:\n"
          "      time.sleep(20)\n"
          "      os._exit(0)\n"
          "    n += 1\n"
          "except OSError as e:\n"
          "  print('fork refused', e.errno)\n"
          "print('forked', n)\n")


def _box(calc_dataset, tmp_path, **config):
  _, root, record = calc_dataset
  return Sandbox.create(root / "acme__calc", record["base_commit"], SandboxConfig(root=str(tmp_path), **config))


def test_process_count_is_limited_per_sandbox(calc_dataset, tmp_path):
  with _box(calc_dataset, tmp_path, timeout_s=20, max_processes=24) as box, \
       _box(calc_dataset, tmp_path, timeout_s=20, max_processes=24) as other:
    result = box.run(f"python -c \"{FORKER}\"")
    assert "fork refused 11" in result.output, result.output  # EAGAIN
    assert int(result.output.split("forked ")[1].split()[0]) < 24
    # The limit is the sandbox's own: another sandbox (and the host) still forks freely.
    assert other.run("sh -c 'echo fine'").output == "fine\n"
    assert box.run("echo alive").output == "alive\n"


def test_repository_growth_ends_the_episode(calc_dataset, tmp_path):
  with _box(calc_dataset, tmp_path, timeout_s=30, disk_mb=4, disk_check_s=0.2) as box:
    # Many files, each under the per-file limit, then lingering: the watcher kills it mid-command.
    result = box.run("for i in $(seq 40); do head -c 1000000 /dev/zero > f$i; done; sleep 25")
    assert result.limit == "disk" and result.exit_code is None and not result.timed_out
    assert "disk limit of the episode exceeded" in result.observation() and box.spent == "disk"
    with pytest.raises(SandboxError, match="spent"):
      box.run("echo more")
  with _box(calc_dataset, tmp_path, disk_mb=2, disk_check_s=60) as box:
    # Finished before any check while running: caught by the check after the command.
    assert box.run("head -c 3000000 /dev/zero > big; echo done").limit == "disk"


def test_tmp_is_a_bounded_tmpfs(calc_dataset, tmp_path):
  with _box(calc_dataset, tmp_path, tmp_mb=4) as box:
    result = box.run("head -c 8000000 /dev/zero > /tmp/big")
    assert result.exit_code != 0 and "No space left" in result.output
    assert box.run("df -k /tmp | tail -1").output.split()[1] == str(4 * 1024)
    assert not box.spent  # /tmp is per command: a full one is the command's problem, not the episode's


def test_env_ends_the_episode_on_the_disk_limit(calc_dataset):
  jsonl, root, _ = calc_dataset
  env = envs.make("swe", jsonl=str(jsonl), snapshot_root=str(root), disk_mb=2)
  try:
    env.reset(env.task_pool()[0])
    observation, done = env.step(ToolCall("bash", {"command": "head -c 3000000 /dev/zero > big"}))
    assert done and "disk limit was exceeded" in observation
    assert env.score() == 0.0 and "disk limit" in env.grade_result.detail and env.grade_result.verdict == "refused"
  finally:
    env.close()


def test_unsandboxed_timeout_kills_a_setsid_child_holding_the_output(calc_dataset, tmp_path):
  marker = "24.321"  # a sleep length nothing else uses, to find the child
  with _box(calc_dataset, tmp_path, isolation="none") as box:
    results = []
    runner = threading.Thread(target=lambda: results.append(box.run(f"setsid sleep {marker} & echo started",
                                                                    timeout_s=1)), daemon=True)
    runner.start()
    runner.join(timeout=15)  # the child sleeps 24 s: returning before that means it was not waited for
    assert not runner.is_alive(), "run() outlived its timeout"
    assert results[0].timed_out and results[0].output.startswith("started")
  alive = []
  for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
      with open(path, "rb") as f:
        if marker.encode() in f.read():
          alive.append(path)
    except OSError:
      pass
  assert not alive, alive
