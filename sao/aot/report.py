"""The compile report as a resumable row file (`experiments/compile_tpu.py --out --resume`).

A full config's report is tens of (program, bucket) compiles of minutes each, hours in all, so each row is written to
the JSON file as soon as it is compiled (atomically: a temporary file renamed over the old one) and a later run skips
the rows the file already holds. The file stays what the report always was: a JSON list of rows, each
`dataclasses.asdict` of a `ReportRow` plus the settings it was compiled for (`SETTINGS_KEYS`, `CODE_KEYS`).
A resume is refused (`ResumeMismatch`, naming the differing setting) when the file was written for another topology,
config, overrides, dtype, layer count, mesh …; rows from another code version (git commit, jax, libtpu) are refused
too unless the caller allows them. A row whose compile raised is recorded as `status="failed"` with the exception
and counts as done (a resume does not retry it unless asked); a program XLA refuses for memory is an ordinary
`does_not_fit` row (`driver.compile_program`). A row whose process was killed (the host's OOM killer, Ctrl-C) never
reached the file, so the resume compiles it again.

Order: the largest bucket first (the row that most likely does not fit, and the one the report is for), programs in
the order the update calls them.
"""
from __future__ import annotations

import dataclasses
import gc
import json
import os
import resource
import tempfile
import time
from typing import Any, Callable, Iterable, Sequence

import jax
import ml_collections

from sao.aot import compile_stats, driver
from sao.aot.tpu_topology import Chip
from sao.models.config import ModelConfig
from sao.train import precompile

# The settings a row was compiled for; a resume refuses a file whose rows differ in any of them.
SETTINGS_KEYS = ("topology", "chips", "config", "config_overrides", "config_sha256", "model_dtype", "param_dtype",
                 "remat", "scan_layers", "master_weights", "mesh", "num_layers")
# The code that compiled it; a resume refuses a difference unless `allow_code_change`.
CODE_KEYS = ("code_version", "jax_version", "libtpu_version")
STATUSES = ("compiled", "does_not_fit", "failed")
MAX_ERROR_CHARS = 4000  # an XLA error can carry a whole HLO module; the head names the problem


class ResumeMismatch(ValueError):
  """The row file was written for other settings than this run's."""


@dataclasses.dataclass
class ReportRow(driver.ProgramRow):
  """A `ProgramRow` as the report file keeps it."""
  status: str = "compiled"  # compiled | does_not_fit | failed (the compile raised: `error` holds the exception)
  # Peak resident set of the compiling process while this row was traced, lowered and compiled (VmHWM after
  # resetting it, scope "row"), or, where the kernel does not allow the reset, the process's high-water mark since it
  # started (getrusage ru_maxrss, scope "process").
  peak_rss_bytes: int = 0
  peak_rss_scope: str = ""


_ROW_FIELDS = {f.name for f in dataclasses.fields(ReportRow)}


def row_from_dict(d: dict[str, Any]) -> ReportRow:
  """A row of the file (its settings dropped). Rows of files written before the `status` field get it from `fits`."""
  missing = {f.name for f in dataclasses.fields(driver.ProgramRow)
             if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING} - set(d)
  if missing:
    raise ValueError(f"report row {d.get('program')!r} at T={d.get('bucket')}: missing fields {sorted(missing)}")
  row = ReportRow(**{k: v for k, v in d.items() if k in _ROW_FIELDS})
  if "status" not in d:
    row.status = "compiled" if row.fits else "does_not_fit"
  if "model_flops_convention" not in d:  # rows compiled before 2026-12-06 counted PaLM's full attention
    row.model_flops_convention = "full_attention"
  if row.status not in STATUSES:
    raise ValueError(f"report row {row.program!r} at T={row.bucket}: status {row.status!r} is not one of {STATUSES}")
  return row


def failed_row(program: str, bucket: int, calls: int, chip: Chip, seconds: float, error: BaseException) -> ReportRow:
  """The row of a compile that raised: no measurements, the exception as its error."""
  message = f"{type(error).__name__}: {error}"
  if len(message) > MAX_ERROR_CHARS:
    message = message[:MAX_ERROR_CHARS] + f" … ({len(message) - MAX_ERROR_CHARS} more characters)"
  return ReportRow(program, bucket, 0, calls, "", False, False, 0, 0, 0, 0, chip.hbm_bytes, 0.0, 0.0, 0.0, None,
                   None, seconds, error=message, status="failed")


class PeakRss:
  """Peak resident memory of this process over a stretch of work (Linux `/proc/self`, see `ReportRow`)."""

  def __init__(self):
    self.scope = "process"  # until a reset succeeds

  def reset(self) -> None:
    try:
      with open("/proc/self/clear_refs", "w") as f:  # "5" resets the peak RSS (VmHWM), Linux ≥ 4.0
        f.write("5")
      self.scope = "row"
    except OSError:
      self.scope = "process"

  def read(self) -> tuple[int, str]:
    if self.scope == "row":
      with open("/proc/self/status") as f:
        for line in f:
          if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024, "row"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process"  # Linux reports KiB


def write_json_atomically(path: str, value: Any) -> None:
  """`value` as JSON at `path`, replacing it in one rename: a reader (or a crash) sees the old file or the new one."""
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
  try:
    os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide the report from other users
    with os.fdopen(fd, "w") as f:
      json.dump(value, f, indent=1)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise


class RowFile:
  """The report's JSON rows at `path` for one run's `settings` (every key of `SETTINGS_KEYS` and `CODE_KEYS`, plus
  anything else to record on each row, such as the command)."""

  def __init__(self, path: str, settings: dict[str, Any], resume: bool, allow_code_change: bool = False):
    missing = set(SETTINGS_KEYS + CODE_KEYS) - set(settings)
    if missing:
      raise ValueError(f"RowFile settings: missing {sorted(missing)}")
    self.path, self.settings = path, dict(settings)
    self.rows: list[dict[str, Any]] = []
    if resume and os.path.exists(path):
      self.rows = self._load(allow_code_change)
    write_json_atomically(path, self.rows)  # now, so that a path that cannot be written fails before any compile

  def _load(self, allow_code_change: bool) -> list[dict[str, Any]]:
    try:
      with open(self.path) as f:
        rows = json.load(f)
    except json.JSONDecodeError as e:
      raise ResumeMismatch(f"cannot resume {self.path}: not a JSON report ({e})") from e
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
      raise ResumeMismatch(f"cannot resume {self.path}: not a list of report rows")
    keys = SETTINGS_KEYS + (() if allow_code_change else CODE_KEYS)
    # JSON turns tuples into lists: compare as JSON does.
    now = json.loads(json.dumps({k: self.settings[k] for k in keys}))
    for row in rows:
      try:
        row_from_dict(row)  # a malformed row stops the resume here, not at the table
      except (TypeError, ValueError) as e:
        raise ResumeMismatch(f"cannot resume {self.path}: {e}") from e
      differ = [f"{k}: file {row.get(k, '<absent>')!r}, this run {now[k]!r}" for k in keys if row.get(k) != now[k]]
      if differ:
        hint = (" (rows from another code version can be kept with --allow_code_change)"
                if set(k.split(":")[0] for k in differ) <= set(CODE_KEYS) else "")
        raise ResumeMismatch(f"cannot resume {self.path}: its row {row.get('program')!r} at T={row.get('bucket')} "
                             f"was compiled with other settings -- {'; '.join(differ)}{hint}")
    return rows

  def done(self, retry_failed: bool = False) -> set[tuple[str, int]]:
    """The (program, bucket) rows a resume skips: all of them, but the failed ones when `retry_failed`."""
    return {(r["program"], int(r["bucket"])) for r in self.rows if not (retry_failed and r.get("status") == "failed")}

  def put(self, row: ReportRow) -> None:
    """Adds `row` (replacing the file's row of the same program and bucket, a retried one) and rewrites the file."""
    record = dict(dataclasses.asdict(row), **self.settings)
    self.rows = [r for r in self.rows if (r["program"], int(r["bucket"])) != (row.program, row.bucket)] + [record]
    write_json_atomically(self.path, self.rows)

  def report_rows(self) -> list[ReportRow]:
    """Every row of the file, by bucket, then in the order they were compiled."""
    return sorted((row_from_dict(r) for r in self.rows), key=lambda r: r.bucket)


def compile_missing(config: ml_collections.ConfigDict, model_config: ModelConfig, devices: Sequence[jax.Device],
                    chip: Chip, buckets: Iterable[int], programs: Sequence[str] = (),
                    done: set[tuple[str, int]] = frozenset(), on_row: Callable[[ReportRow], None] = lambda row: None,
                    log: Callable[[str], None] = lambda message: None, hlo_dir: str = "") -> list[ReportRow]:
  """The rows of `driver.compile_update` that are not in `done`, largest bucket first, each handed to `on_row` as soon
  as it exists. A compile that raises (anything but XLA's out-of-memory, which `driver.compile_program` reports as a
  row that does not fit) gives a `failed` row; KeyboardInterrupt and the like still stop the run. `hlo_dir`: where
  each compiled program's HLO text goes (`driver.compile_program`)."""
  learner = driver.abstract_learner(config, model_config, devices)
  n_active = {role.name: compile_stats.active_params(model_config, role.abstract_params)
              for role in (learner.actor, learner.critic) if role is not None}
  rows, peak = [], PeakRss()
  for bucket in sorted({int(b) for b in buckets}, reverse=True):
    if programs and all((name, bucket) in done for name in programs):
      continue  # nothing to do at this bucket: not even the (abstract) update
    # The same abstract batch and recording `driver.compile_update` builds for the bucket.
    batch = precompile.abstract_batch(learner, int(config.rollout.batch_size), bucket)
    recorded = driver.record_update(learner, batch)
    unknown = set(programs) - set(recorded)
    if unknown:
      raise ValueError(f"programs: {sorted(unknown)} are not programs of this update ({list(recorded)})")
    todo = [name for name in recorded if (not programs or name in programs) and (name, bucket) not in done]
    log(f"T={bucket}: {len(todo)} programs to compile ({', '.join(todo) or 'none'})")
    for name in todo:
      jitted, args, calls = recorded[name]
      log(f"  compiling {name} at T={bucket} …")
      peak.reset()
      start = time.perf_counter()
      try:
        row = ReportRow(**vars(driver.compile_program(name, jitted, args, calls, learner, model_config, chip, bucket,
                                                   n_active, hlo_dir=hlo_dir)))
        row.status = "compiled" if row.fits else "does_not_fit"
      except Exception as e:  # pylint: disable=broad-except  # recorded on the row, and the exit code says so
        row = failed_row(name, bucket, calls, chip, time.perf_counter() - start, e)
      row.peak_rss_bytes, row.peak_rss_scope = peak.read()
      on_row(row)
      rows.append(row)
      # jax keeps every traced and lowered program in its caches: a process compiling full-depth rows grew by about
      # 2 GiB per row (21 GiB after 12 rows, 2026-12-01), so drop them between rows. How much this returns at full
      # depth is not measured yet: the complete report (docs/tpu.md) runs one bucket per process.
      jax.clear_caches()
      gc.collect()
  return rows
