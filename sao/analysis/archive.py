"""A finished (or cut-short) run trimmed to what the sweep tables read, as committed under
`experiments/paper/runs/<sweep>/<run>/`:

    metrics.jsonl      the records' `step`, `time`, `phase/*` and `ANALYSIS_KEYS` (floats to 6 significant digits,
                       `time` to the millisecond; ≈ 200 bytes a step); every other key, the `hparams` line and the
                       progress rows' copy of the latest validation are dropped
    run.json           `RUN_FILE`: name, arm, seed, config, overrides, code version, status (`complete` when the run
                       finished — its launcher wrote DONE — and logged its last step; else `incomplete`), last and
                       expected last step, restarts, and a note (the last error line of an incomplete run's launch
                       log; that a resumed run's wall times include its restarts)

A resumed run logs again from its checkpoint's step; the records of the abandoned attempt after that step are
dropped (`drop_abandoned`).
    evaluation/vN.json the final policy's re-measurement (`experiments/evaluate.py`), copied when present

Nothing else (checkpoints, trajectories, policies, TensorBoard events, critic traces) is kept.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from typing import Any, Mapping

from sao.analysis import runs as runs_lib
from sao.analysis.curves import EVAL_RECORD_KEY, read_metrics

RUN_FILE = "run.json"
COMPLETE, INCOMPLETE = "complete", "incomplete"
WAIT_KEY = "trainer/wait_s"  # seconds the trainer waited for the step's batch (the busy-fraction input)
ANALYSIS_KEYS = (
    "validation", EVAL_RECORD_KEY, "validation/policy_version", "batch/num_trajectories", "dropped", "reward",
    "turns", "response_length", runs_lib.EV_KEY, "staleness", WAIT_KEY)
# What `sao.analysis.tables.paper_tables` and `figures` read beyond the sweep tables (the recorded test runs).
PAPER_TABLE_KEYS = ANALYSIS_KEYS + (
    "actor/grad_norm", "critic/grad_norm", "advantages/mean_before_whiten")
CRITIC_TRACES_FILE = "critic_traces.jsonl"


def _round(key: str, value: Any) -> Any:
  if isinstance(value, float) and math.isfinite(value):
    return round(value, 3) if key == "time" else float(f"{value:.6g}")
  return value


def trim_records(records: list[dict], keys: tuple[str, ...] = ANALYSIS_KEYS) -> list[dict]:
  """Each record reduced to `step`, `time`, `phase/*` and `keys` (module docstring). When the log marks its
  evaluation records (`EVAL_RECORD_KEY`), the progress rows' repeated `validation` is dropped too."""
  marked = any(EVAL_RECORD_KEY in r for r in records)
  out = []
  for r in records:
    keep = {k: _round(k, v) for k, v in r.items()
            if (k in ("step", "time") or k.startswith("phase/") or k in keys)
            and not (marked and k == "validation" and EVAL_RECORD_KEY not in r)}
    out.append(keep)
  return out


def drop_abandoned(records: list[dict]) -> tuple[list[dict], int]:
  """(the records without those a restart superseded, the number of restarts). A resumed trainer logs again from its
  checkpoint's step: where the step goes back to s, the earlier attempt's records of steps ≥ s are dropped."""
  out: list[dict] = []
  restarts = 0
  for r in records:
    if out and r["step"] < out[-1]["step"]:
      restarts += 1
      out = [o for o in out if o["step"] < r["step"]]
    out.append(r)
  return out, restarts


def run_status(records: list[dict], finished: bool, expected_last_step: int) -> tuple[str, int]:
  """(`complete` | `incomplete`, the last logged step; −1 when none)."""
  last = max((int(r["step"]) for r in records), default=-1)
  return (COMPLETE if finished and last >= expected_last_step else INCOMPLETE), last


def error_note(log_path: str, chars: int = 20_000) -> str:
  """The last line of the launch log that names an error (a traceback's last line), or ""."""
  if not os.path.isfile(log_path):
    return ""
  with open(log_path, "rb") as f:
    f.seek(0, os.SEEK_END)
    f.seek(max(f.tell() - chars, 0))
    lines = f.read().decode(errors="replace").splitlines()
  for line in reversed(lines):
    text = line.strip()
    if text and ("Error" in text.split(":", 1)[0] or text.startswith(("Traceback", "[launch]"))):
      return text[:300]
  return ""


def _write_metrics(dst_dir: str, records: list[dict]) -> None:
  with open(os.path.join(dst_dir, runs_lib.METRICS_FILE), "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")


def write_trimmed_run(src_workdir: str, dst_dir: str, info: Mapping[str, Any], finished: bool,
                      expected_last_step: int, log_path: str = "") -> dict[str, Any]:
  """Writes `dst_dir` (module docstring) from the run directory `src_workdir`; returns the `run.json` content.
  `info` holds name, arm, seed, config, overrides and code_version. Raises FileNotFoundError when the run logged
  nothing."""
  path = os.path.join(src_workdir, runs_lib.METRICS_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"run {info.get('name')!r}: {src_workdir!r} has no {runs_lib.METRICS_FILE}")
  records, restarts = drop_abandoned(trim_records(read_metrics(path)))
  status, last = run_status(records, finished, expected_last_step)
  notes = [error_note(log_path)] if status == INCOMPLETE else []
  if restarts:
    notes.append(f"resumed {restarts}× from a checkpoint: its wall times include the restarts")
  meta = {**info, "status": status, "last_step": last, "expected_last_step": expected_last_step,
          "restarts": restarts, "note": "; ".join(n for n in notes if n)}
  if os.path.isdir(dst_dir):
    shutil.rmtree(dst_dir)  # a re-trim replaces the whole directory (no stale evaluation files)
  os.makedirs(dst_dir)
  _write_metrics(dst_dir, records)
  found = runs_lib.final_evaluation(src_workdir)
  if found is not None:
    name, results = found
    os.makedirs(os.path.join(dst_dir, runs_lib.EVALUATION_DIR))
    with open(os.path.join(dst_dir, runs_lib.EVALUATION_DIR, f"{name}.json"), "w", encoding="utf-8") as f:
      json.dump(results, f, indent=1, sort_keys=True)
  with open(os.path.join(dst_dir, RUN_FILE), "w", encoding="utf-8") as f:
    json.dump(meta, f, indent=1, sort_keys=True, default=list)
  return meta


def write_recorded_run(src_workdir: str, dst_dir: str) -> int:
  """A run kept as test data for the paper tables (`tests/analysis/data/<run>/`): its metrics trimmed to
  `PAPER_TABLE_KEYS` (abandoned attempts dropped) and its critic traces as logged; returns the records written."""
  path = os.path.join(src_workdir, runs_lib.METRICS_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{src_workdir!r} has no {runs_lib.METRICS_FILE}")
  records, _ = drop_abandoned(trim_records(read_metrics(path), PAPER_TABLE_KEYS))
  os.makedirs(dst_dir, exist_ok=True)
  _write_metrics(dst_dir, records)
  traces = os.path.join(src_workdir, CRITIC_TRACES_FILE)
  stale = os.path.join(dst_dir, CRITIC_TRACES_FILE)
  if os.path.isfile(traces):
    shutil.copyfile(traces, stale)
  elif os.path.isfile(stale):
    os.remove(stale)  # a GSPO run has none: do not leave an older run's traces beside its metrics
  return len(records)
