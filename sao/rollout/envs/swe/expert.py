"""Scripted expert for the "swe" environment: reproduce the issue, locate the code, read it, fix it, run the tests,
submit — through the same tools a model uses.

The expert knows the fix: generated tasks carry it in `task["expert"]` (`path`, `old`, `new`, and the issue's
`repro` command and `symbol`), SWE-bench instances in their gold `patch` (applied with `git apply` from `bash`).
It follows a fixed plan and advances only when the planned call ran, so noisy actions interleaved by
`Env.demonstrate(noise=...)` delay it but do not derail it.
"""
from __future__ import annotations

import shlex
from typing import Any, Mapping

import numpy as np

from sao.rollout.envs.swe.dataset import Instance
from sao.rollout.envs.swe.sandbox import WORKDIR
from sao.rollout.tool_format import ToolCall

TEST_COMMAND = "python -m pytest -q -p no:cacheprovider"


def _plan(task: Mapping[str, Any], instance: Instance) -> list[ToolCall]:
  fix = task.get("expert")
  if fix is not None:
    path = f"{WORKDIR}/{fix['path']}"
    plan = []
    if fix.get("repro"):
      plan.append(ToolCall("bash", {"command": fix["repro"]}))
    if fix.get("symbol"):
      plan.append(ToolCall("bash", {"command": f"grep -rn {shlex.quote('def ' + fix['symbol'])} --include=*.py ."}))
    plan += [ToolCall("str_replace_editor", {"command": "view", "path": path}),
             ToolCall("str_replace_editor", {"command": "str_replace", "path": path, "old_str": fix["old"],
                                             "new_str": fix["new"]}),
             ToolCall("bash", {"command": TEST_COMMAND}),
             ToolCall("submit", {})]
    return plan
  if instance.patch:
    delimiter = "SAO_EXPERT_PATCH_EOF"
    while delimiter in instance.patch:
      delimiter += "_"
    body = instance.patch if instance.patch.endswith("\n") else instance.patch + "\n"
    return [ToolCall("str_replace_editor", {"command": "view", "path": WORKDIR}),
            ToolCall("bash", {"command": f"git apply --verbose - <<'{delimiter}'\n{body}{delimiter}"}),
            ToolCall("bash", {"command": "git diff --stat"}),
            ToolCall("submit", {})]
  raise ValueError(f"instance {instance.instance_id!r}: no expert fix (no task['expert'] and no gold 'patch')")


class Expert:
  """The plan for one episode and how far it got."""

  def __init__(self, task: Mapping[str, Any], instance: Instance):
    self.plan = _plan(task, instance)
    self.position = 0

  def next_call(self) -> ToolCall:
    return self.plan[min(self.position, len(self.plan) - 1)]

  def observe(self, call: ToolCall, observation: str) -> None:
    """Advances past the planned call once it has run (a failed edit is retried: its observation says ERROR)."""
    if self.position < len(self.plan) and call == self.plan[self.position]:
      if not (call.name == "str_replace_editor" and observation.startswith("ERROR")):
        self.position += 1


def noisy_call(rng: np.random.Generator, instance: Instance | None) -> ToolCall:
  """A plausible but unhelpful call of a weak agent: looks around, runs tests, edits wrongly, or submits early."""
  choices = [
      ToolCall("bash", {"command": "ls -R | head -50"}),
      ToolCall("bash", {"command": TEST_COMMAND}),
      ToolCall("bash", {"command": "git status"}),
      ToolCall("str_replace_editor", {"command": "view", "path": WORKDIR}),
      ToolCall("str_replace_editor", {"command": "str_replace", "path": f"{WORKDIR}/setup.py", "old_str": "x = 1",
                                      "new_str": "x = 2"}),
      ToolCall("submit", {}),
  ]
  return choices[int(rng.integers(len(choices)))]
