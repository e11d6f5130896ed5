"""Metric writers: a JSONL log (what `sao.analysis` reads) and TensorBoard event files, behind clu's interface.

`clu.metric_writers` cannot be imported without TensorFlow (clu 0.0.12: its `__init__` imports the TF summary
writer; `python -X importtime -c "import clu.metric_writers"` ends in `ModuleNotFoundError: No module named
'tensorflow'`, and clu does not declare it), and TensorFlow stays out of the default install. These writers implement
the same methods (`write_scalars(step, scalars)`, `write_hparams`, `flush`, `close`) with the `tensorboard` package's
own event-file writer, which needs no TensorFlow. clu is used where it imports cleanly: `clu.metrics` (the train
steps' metrics, merged across micro-batches) and `clu.parameter_overview` (the learner's parameter table at start).
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Mapping, Sequence

import numpy as np

METRICS_FILE = "metrics.jsonl"


def _scalar(value: Any) -> float:
  return float(np.asarray(value).item())


class JsonlWriter:
  """One JSON object per `write_scalars` call: `{"step": s, "time": t, **scalars}`. Non-finite values become null."""

  def __init__(self, directory: str, filename: str = METRICS_FILE):
    os.makedirs(directory, exist_ok=True)
    self.path = os.path.join(directory, filename)
    self._file = open(self.path, "a", encoding="utf-8")

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    record: dict[str, Any] = {"step": int(step), "time": time.time()}
    for key, value in scalars.items():
      v = _scalar(value)
      record[key] = v if math.isfinite(v) else None
    self._file.write(json.dumps(record) + "\n")

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    self._file.write(json.dumps({"hparams": {k: str(v) for k, v in hparams.items()}}) + "\n")

  def flush(self) -> None:
    self._file.flush()
    os.fsync(self._file.fileno())

  def close(self) -> None:
    if not self._file.closed:
      self.flush()
      self._file.close()


class TensorBoardWriter:
  """Scalars as TensorBoard events under `directory` (open with `tensorboard --logdir`)."""

  def __init__(self, directory: str):
    from tensorboard.compat.proto import event_pb2, summary_pb2  # pylint: disable=g-import-not-at-top
    from tensorboard.summary.writer.event_file_writer import EventFileWriter  # pylint: disable=g-import-not-at-top
    self._event_pb2, self._summary_pb2 = event_pb2, summary_pb2
    self._writer = EventFileWriter(directory)

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    values = [self._summary_pb2.Summary.Value(tag=k, simple_value=_scalar(v)) for k, v in scalars.items()]
    self._writer.add_event(self._event_pb2.Event(wall_time=time.time(), step=int(step),
                                                 summary=self._summary_pb2.Summary(value=values)))

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    del hparams  # recorded in the JSONL log and the config file

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


class MultiWriter:
  """Fans every call out to several writers."""

  def __init__(self, writers: Sequence[Any]):
    self.writers = list(writers)

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    for w in self.writers:
      w.write_scalars(step, scalars)

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    for w in self.writers:
      w.write_hparams(hparams)

  def flush(self) -> None:
    for w in self.writers:
      w.flush()

  def close(self) -> None:
    for w in self.writers:
      w.close()


def create_default_writer(workdir: str, tensorboard: bool = True) -> MultiWriter:
  """JSONL at `<workdir>/metrics.jsonl` plus TensorBoard events in `<workdir>/tensorboard/`."""
  writers: list[Any] = [JsonlWriter(workdir)]
  if tensorboard:
    writers.append(TensorBoardWriter(os.path.join(workdir, "tensorboard")))
  return MultiWriter(writers)
