"""The local sweep runner against a fake trainer (tests/launch/fake_train.py): success, failure, cut-off + resume,
skip of finished runs, bounded parallelism."""
from __future__ import annotations

import io
import os
import subprocess
import sys

from launch import local
from launch import sweep as s

FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_train.py")
CONFIG = "experiments/configs/sao_openswe.py:toy"


def _fake_command(run, run_dir):
  return run.command(run_dir, train_script=FAKE)


def _attempts(root, name):
  with open(os.path.join(root, name, "attempts")) as f:
    return len(f.read().splitlines())


def test_success_failure_cutoff_then_resume_and_skip(tmp_path):
  runs = s.runs("fake", CONFIG, s.sweep("seed", [0, 1, 2]))
  out = io.StringIO()
  states = local.run_sweep(runs, str(tmp_path), max_parallel=1, command_fn=_fake_command, poll_s=0.02, out=out)
  by_name = {st.run.name: st for st in states}
  assert by_name["fake-seed0"].status == local.DONE_STATUS
  assert by_name["fake-seed1"].status == local.FAILED and by_name["fake-seed1"].returncode == 3
  assert by_name["fake-seed2"].status == local.CUT_OFF and by_name["fake-seed2"].returncode < 0
  text = out.getvalue()
  assert "boom: the fake trainer failed" in text  # the failed run's log tail is reported
  assert "rerunning the sweep resumes it" in text
  assert "fake-seed0" in text and "step" in text  # the progress table
  assert os.path.isfile(tmp_path / "fake-seed0" / local.DONE)
  assert not os.path.exists(tmp_path / "fake-seed1" / local.DONE)

  # Second invocation: the finished run is skipped, the cut-off one resumes in its workdir and finishes.
  out = io.StringIO()
  states = local.run_sweep(runs, str(tmp_path), max_parallel=1, command_fn=_fake_command, poll_s=0.02, out=out)
  by_name = {st.run.name: st for st in states}
  assert by_name["fake-seed0"].status == local.SKIPPED and _attempts(tmp_path, "fake-seed0") == 1
  assert by_name["fake-seed2"].status == local.DONE_STATUS and _attempts(tmp_path, "fake-seed2") == 2
  with open(tmp_path / "fake-seed2" / local.LOG) as f:
    assert "resumed from checkpoint" in f.read()
  assert by_name["fake-seed1"].status == local.FAILED


def test_initial_status(tmp_path):
  assert local.initial_status(str(tmp_path / "new")) == local.PENDING
  (tmp_path / "old").mkdir()
  (tmp_path / "old" / "metrics.jsonl").write_text("")
  assert local.initial_status(str(tmp_path / "old")) == local.RESUME
  (tmp_path / "old" / local.DONE).write_text("{}")
  assert local.initial_status(str(tmp_path / "old")) == local.SKIPPED


def test_bounded_parallelism(tmp_path, monkeypatch):
  shared = tmp_path / "shared"
  shared.mkdir()
  monkeypatch.setenv("FAKE_TRAIN_SHARED", str(shared))
  runs = s.runs("par", CONFIG, s.sweep("seed", [0, 3, 4, 5]))
  states = local.run_sweep(runs, str(tmp_path / "runs"), max_parallel=2, command_fn=_fake_command, poll_s=0.02,
                           out=io.StringIO())
  assert all(st.status == local.DONE_STATUS for st in states)
  counts = [int(c) for c in (shared / "concurrency").read_text().split()]
  assert len(counts) == 4 and max(counts) <= 2


def test_cli_dry_run_and_unknown_key(tmp_path):
  sweep_file = tmp_path / "sweep.py"
  sweep_file.write_text(
      "from launch import sweep as s\n"
      f"def get_sweep():\n  return s.runs('x', {CONFIG!r}, s.sweep('seed', [0, 1]))\n")
  repo = s.REPO_ROOT
  result = subprocess.run([sys.executable, "-m", "launch.local", f"--sweep={sweep_file}",
                           f"--workdir={tmp_path / 'w'}", "--dry_run"], cwd=repo, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 0, result.stderr
  assert "[pending]" in result.stdout and "--config.seed=1" in result.stdout
  assert not os.path.exists(tmp_path / "w")
  sweep_file.write_text(
      "from launch import sweep as s\n"
      f"def get_sweep():\n  return s.runs('x', {CONFIG!r}, s.sweep('rollout.batchsize', [1, 2]))\n")
  result = subprocess.run([sys.executable, "-m", "launch.local", f"--sweep={sweep_file}",
                           f"--workdir={tmp_path / 'w'}", "--dry_run"], cwd=repo, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode != 0 and "unknown sweep key 'rollout.batchsize'" in result.stderr


def test_progress_table_is_reprinted_while_a_run_goes(tmp_path, monkeypatch):
  # Two fake runs that each take ~0.4 s (FAKE_TRAIN_SHARED), one at a time, with a report every 0.1 s: besides the
  # tables at start/end of each run, several periodic ones appear.
  monkeypatch.setenv("FAKE_TRAIN_SHARED", str(tmp_path / "shared"))
  runs = s.runs("fake", CONFIG, s.sweep("seed", [0, 3]))
  out = io.StringIO()
  local.run_sweep(runs, str(tmp_path / "runs"), command_fn=_fake_command, poll_s=0.02, out=out, report_s=0.1)
  quiet = io.StringIO()
  local.run_sweep(runs, str(tmp_path / "again"), command_fn=_fake_command, poll_s=0.02, out=quiet, report_s=1e9)
  tables, event_tables = out.getvalue().count("run  "), quiet.getvalue().count("run  ")
  assert event_tables == 5, quiet.getvalue()  # the tables printed on events only
  assert tables > event_tables + 2, out.getvalue()


FAKE_PROCESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_trainer_process.py")


def _records(workdir, n):
  import json  # pylint: disable=g-import-not-at-top
  return [json.load(open(os.path.join(workdir, f"process{i}.json"))) for i in range(n)]


def test_trainer_job_gives_every_process_the_same_flags_and_its_coordinates(tmp_path, monkeypatch):
  monkeypatch.delenv("FAKE_FAIL", raising=False)
  code = local.run_trainer_job([f"--config={CONFIG}", "--config.total_steps=3"], str(tmp_path), 3,
                               devices_per_process=4, poll_s=0.05, train_script=FAKE_PROCESS)
  assert code == 0
  records = _records(tmp_path, 3)
  for i, r in enumerate(records):
    assert r["argv"][-1] == f"--config.distributed.process_id={i}"
    assert "--xla_force_host_platform_device_count=4" in r["xla_flags"] and r["platforms"] == "cpu"
  assert len({tuple(r["argv"][:-1]) for r in records}) == 1  # one config for all
  argv = records[0]["argv"]
  assert argv[:2] == [f"--config={CONFIG}", "--config.total_steps=3"] and f"--workdir={tmp_path}" in argv
  address = next(a for a in argv if a.startswith("--config.distributed.coordinator_address=127.0.0.1:"))
  assert int(address.rsplit(":", 1)[1]) > 0 and "--config.distributed.num_processes=3" in argv
  # Process 0 speaks on the launcher's stdout; the others log under <workdir>/logs.
  with open(tmp_path / "logs" / "trainer_process1.log") as f:
    assert "fake trainer process 1" in f.read()


def test_trainer_job_exits_with_the_first_failure_and_ends_the_rest(tmp_path, monkeypatch):
  monkeypatch.setenv("FAKE_FAIL", "1")
  code = local.run_trainer_job([f"--config={CONFIG}"], str(tmp_path), 2, poll_s=0.05, stop_grace_s=0.5,
                               train_script=FAKE_PROCESS)
  assert code == 3  # process 0 was still waiting when the grace ran out: killed, and the job reports the failure


def test_trainer_job_cli_errors(tmp_path):
  run = lambda *a: subprocess.run([sys.executable, "-m", "launch.local", f"--workdir={tmp_path}", *a],  # noqa: E731
                                  cwd=s.REPO_ROOT, capture_output=True, text=True, timeout=120)
  result = run("--trainer_processes=2", "--", "--config.total_steps=3")
  assert result.returncode != 0 and "need --config=<file>:<arg>" in result.stderr
  result = run("--", f"--config={CONFIG}")
  assert result.returncode != 0 and "need --trainer_processes" in result.stderr
