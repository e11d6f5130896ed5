"""Synthetic sweep run directories in the trainer's on-disk format (records written by `sao.train.writers`'s
`JsonlWriter`, a launcher `DONE` marker, `code_version.json`, `launch.log`, `evaluation/vN.json`), with known numbers.

Each run: `pretrain` value-pretraining steps (SAO) then `rl_steps` RL steps of 64 trajectories (60 trained + 4
dropped); the clock advances `step_s` seconds per logged step from t = 1000; evaluations (base at the first logged
step, then trained versions at RL steps 10, 20, 30 and the last) have the given success rates.
"""
from __future__ import annotations

import json
import os

from launch import local
from launch import sweep as sweep_lib
from sao.train import writers

VERSION = "a" * 40


def sweep_file(tmp_path, kind_block: str, runs_block: str) -> str:
  path = tmp_path / "test_sweep.py"
  path.write_text("from launch import sweep as s\n\n" + kind_block + "\n\ndef get_sweep():\n" + runs_block + "\n")
  return str(path)


def write_run(workdir: str, evals: list[float], *, pretrain: int = 0, rl_steps: int = 40, step_s: float = 3.0,
              wait_s: float | None = None, finished: bool = True, evaluation: dict | None = None,
              version: str = VERSION, ev: float = 0.25, log_tail: str = "", monkeypatch=None) -> None:
  """`evals`: [base, trained at RL 10, 20, 30, last]; with `finished=False` the run stops after `rl_steps` RL steps
  without a DONE marker."""
  clock = {"t": 1000.0}
  monkeypatch.setattr(writers.time, "time", lambda: clock["t"])
  writer = writers.JsonlWriter(workdir)
  writer.write_hparams({"seed": 0})
  eval_steps = {0: (0, evals[0])}
  for i, rl in enumerate((10, 20, 30, rl_steps - 1)):
    if i + 1 < len(evals):
      eval_steps[pretrain + rl] = (rl, evals[i + 1])
  for step in range(pretrain + rl_steps):
    clock["t"] = 1000.0 + step_s * step
    if step in eval_steps:
      version_trained, value = eval_steps[step]
      writer.write_scalars(step, {"validation": value, "validation/policy_version": version_trained,
                                  "validation/num_tasks": 21})
    phase = "phase/value_pretrain" if step < pretrain else "phase/rl"
    rl = step - pretrain
    row = {"reward": 0.202 + 0.01 * rl if rl >= 0 else 0.1, "turns": 4.0, "response_length": 20.0 - 0.1 * max(rl, 0),
           "batch/num_trajectories": 60.0, "dropped": 4.0, "staleness": 1.0, "critic/explained_variance": ev,
           "actor/grad_norm": 0.5, phase: 1.0}
    if wait_s is not None:
      row["trainer/wait_s"] = wait_s
    writer.write_scalars(step, row)
  writer.close()
  sweep_lib.stamp_code_version(workdir, version) if version else None
  with open(os.path.join(workdir, local.LOG), "w") as f:
    f.write("[rl] step 0\n" + log_tail)
  if finished:
    with open(os.path.join(workdir, local.DONE), "w") as f:
      json.dump({"run": os.path.basename(workdir)}, f)
  if evaluation is not None:
    os.makedirs(os.path.join(workdir, "evaluation"))
    with open(os.path.join(workdir, "evaluation", f"v{rl_steps - 1}.json"), "w") as f:
      json.dump({split: {"success_rate": rate, "stderr": 0.01, "episodes": 252, "num_tasks": 21, "mean_reward": rate,
                         "by_status": {}} for split, rate in evaluation.items()}, f)
