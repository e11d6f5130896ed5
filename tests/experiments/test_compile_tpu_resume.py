"""The compile report's row file (`sao.aot.report`): rows written one by one, resume, refusal, failed rows.

The programs compile for the host's CPU devices (no libtpu, no TPU compile lock): one real compile of the tiny
critic's `critic_values`; the other rows come from a stand-in for `driver.compile_program` that records its calls.
"""
from __future__ import annotations

import dataclasses
import gzip
import json

import jax
import pytest

from experiments.compile_tpu import model_config_of
from experiments.configs import sao_openswe
from sao.aot import driver, instruction_time, report
from sao.aot.tpu_topology import Chip

CPU_CHIP = Chip("cpu", "cpu", 1 << 40, 1e12, 1e11, "", 1e10, 4)
PROGRAMS = ("monte_carlo_returns", "critic_step", "critic_values")  # in the update's order


def _settings(**changes):
  settings = {"topology": "v5p:2x2x1", "chips": 4, "config": "sao_openswe_toy", "config_overrides": "toy",
              "config_sha256": "abc", "model_dtype": "float32", "param_dtype": "float32", "remat": "none",
              "scan_layers": False, "master_weights": False, "mesh": {"fsdp": 2, "tensor": -1}, "num_layers": 2,
              "code_version": "f89dc0d", "jax_version": "0.10.2", "libtpu_version": "0.0.42.1", "command": "x"}
  return dict(settings, **changes)


def _fake_row(program: str, bucket: int, status: str = "compiled") -> report.ReportRow:
  if status == "failed":
    return report.failed_row(program, bucket, 1, CPU_CHIP, 0.5, RuntimeError("boom"))
  return report.ReportRow(program, bucket, 8, 1, "critic", False, status == "compiled", 1, 2, 3, 6, 1 << 40,
                              1e9, 1e9, 1e9, 1e-3, 0.3, 0.5, status=status)


def test_a_resume_of_a_file_for_other_settings_is_refused(tmp_path):
  path = str(tmp_path / "rows.json")
  row_file = report.RowFile(path, _settings(), resume=False)
  row_file.put(_fake_row("critic_values", 64))
  assert report.RowFile(path, _settings(), resume=True).done() == {("critic_values", 64)}
  for key, value in [("topology", "v5p:4x4x8"), ("config_overrides", "toy,rollout.batch_size=8"),
                     ("model_dtype", "bfloat16"), ("num_layers", 4), ("config", "gspo_openswe_toy"),
                     ("mesh", {"fsdp": 4, "tensor": -1})]:
    with pytest.raises(report.ResumeMismatch, match=f"cannot resume .*{key}: file .*, this run {value!r}"):
      report.RowFile(path, _settings(**{key: value}), resume=True)
  # Another code version: refused, unless allowed (each row keeps its own).
  with pytest.raises(report.ResumeMismatch, match="code_version: file 'f89dc0d', this run 'deadbee'.*--allow"):
    report.RowFile(path, _settings(code_version="deadbee"), resume=True)
  kept = report.RowFile(path, _settings(code_version="deadbee"), resume=True, allow_code_change=True)
  assert kept.done() == {("critic_values", 64)}
  # Without --resume the file is started anew, at once.
  assert report.RowFile(path, _settings(topology="v4:2x2x1"), resume=False).rows == []
  assert json.loads(open(path).read()) == []
  with pytest.raises(FileNotFoundError):  # an unwritable --out fails before the first compile
    report.RowFile(str(tmp_path / "missing" / "rows.json"), _settings(), resume=False)
  (tmp_path / "bad.json").write_text('{"program": "x"}')
  with pytest.raises(report.ResumeMismatch, match="not a list of report rows"):
    report.RowFile(str(tmp_path / "bad.json"), _settings(), resume=True)
  (tmp_path / "bad.json").write_text('[{"program": "critic_values", "bucket": 64}]')
  with pytest.raises(report.ResumeMismatch, match="bad.json: report row 'critic_values' .*missing fields"):
    report.RowFile(str(tmp_path / "bad.json"), _settings(), resume=True)


def test_failed_rows_count_as_done_unless_retried(tmp_path):
  path = str(tmp_path / "rows.json")
  row_file = report.RowFile(path, _settings(), resume=False)
  row_file.put(_fake_row("critic_values", 64, "does_not_fit"))
  row_file.put(_fake_row("critic_step", 64, "failed"))
  resumed = report.RowFile(path, _settings(), resume=True)
  assert resumed.done() == {("critic_values", 64), ("critic_step", 64)}
  assert resumed.done(retry_failed=True) == {("critic_values", 64)}
  (failed,) = [r for r in resumed.report_rows() if r.program == "critic_step"]
  assert failed.status == "failed" and not failed.fits and failed.error == "RuntimeError: boom"
  resumed.put(_fake_row("critic_step", 64))  # the retry replaces the failed row
  rows = json.loads(open(path).read())
  assert [(r["program"], r["status"]) for r in rows] == [("critic_values", "does_not_fit"), ("critic_step", "compiled")]


def test_rows_reach_the_file_one_by_one_and_a_resume_compiles_only_the_missing(tmp_path, monkeypatch):
  config = sao_openswe.get_config("toy,rollout.batch_size=8")
  config.unlock()
  config.model.toy.model_type = "qwen3_moe"
  config.lock()
  model_config = model_config_of(config, "float32")
  devices = jax.devices("cpu")[:1]
  real_compile = driver.compile_program
  compiled = []

  def compile_program(name, jitted, args, calls, learner, model_config, chip, bucket, n_active, hlo_dir=""):
    compiled.append((name, bucket))
    if name == "critic_step":
      raise RuntimeError(f"no {name} today")
    if (name, bucket) == ("critic_values", 32):  # one real compile: its row must survive the JSON round trip
      return real_compile(name, jitted, args, calls, learner, model_config, chip, bucket, n_active, hlo_dir)
    return _program_row(_fake_row(name, bucket))

  monkeypatch.setattr(driver, "compile_program", compile_program)
  path = str(tmp_path / "rows.json")

  def run(resume: bool, retry_failed: bool = False):
    row_file = report.RowFile(path, _settings(), resume=resume)
    in_file = []

    def on_row(row):
      row_file.put(row)
      in_file.append(len(json.loads(open(path).read())))
    compiled.clear()
    new = report.compile_missing(config, model_config, devices, CPU_CHIP, (16, 32), PROGRAMS,
                                     row_file.done(retry_failed), on_row, hlo_dir=str(tmp_path / "hlo"))
    return row_file, new, in_file

  row_file, new, in_file = run(resume=False)
  # Largest bucket first, programs in the update's order; each row in the file as soon as it exists.
  assert compiled == [(p, b) for b in (32, 16) for p in PROGRAMS]
  assert in_file == [1, 2, 3, 4, 5, 6]
  by_key = {(r.program, r.bucket): r for r in row_file.report_rows()}
  real = by_key["critic_values", 32]
  assert real.status == "compiled" and real.hbm_bytes_per_chip > 0 and real.flops > 0
  assert real.peak_rss_bytes > 0 and real.peak_rss_scope in ("row", "process")
  with gzip.open(driver.hlo_path(str(tmp_path / "hlo"), "critic_values", 32), "rt") as f:  # the compiled module's text
    text = f.read()
  assert "ENTRY" in text
  # The row is priced per instruction from that same text (CPU devices: no expert axis, every grouped row).
  assert real.instruction_seconds == instruction_time.serial_seconds(text, CPU_CHIP) > 0
  assert real.grouped_row_share == 1.0 and real.instruction_error == ""
  assert by_key["critic_step", 16].status == "failed" and "no critic_step today" in by_key["critic_step", 16].error

  # Half of the file lost (as if the run had been killed after three rows): the resume compiles the other three.
  rows = json.loads(open(path).read())
  report.write_json_atomically(path, rows[:3])
  _, new, in_file = run(resume=True)
  assert compiled == [(p, 16) for p in PROGRAMS] and in_file == [4, 5, 6]
  _, new, _ = run(resume=True)  # nothing left: the failed rows count as done
  assert compiled == [] and new == []
  run(resume=True, retry_failed=True)
  assert compiled == [("critic_step", 32), ("critic_step", 16)]
  assert len(json.loads(open(path).read())) == 6


def _program_row(row: report.ReportRow) -> driver.ProgramRow:
  """What `driver.compile_program` returns: the `ProgramRow` fields of `row`."""
  return driver.ProgramRow(**{f.name: getattr(row, f.name) for f in dataclasses.fields(driver.ProgramRow)})


def test_the_overrides_a_row_records_do_not_depend_on_the_flag_order():
  from experiments.compile_tpu import config_overrides  # pylint: disable=g-import-not-at-top
  a = config_overrides(["compile_tpu.py", "--config=c.py:toy,rollout.batch_size=8", "--config.b=2", "--config.a=1",
                        "--topology=v5p:2x2x1"])
  assert a == "toy,rollout.batch_size=8 config.a=1 config.b=2"
  assert config_overrides(["compile_tpu.py", "--config.a=1", "--config.b=2", "--config=c.py:toy,rollout.batch_size=8"
                           ]) == a
  assert config_overrides(["compile_tpu.py", "--config=c.py:full"]) != config_overrides(["compile_tpu.py",
                                                                                         "--config=c.py:toy"])
