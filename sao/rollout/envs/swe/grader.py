"""SWE-bench grading from an allow-list: the grader builds the tree it tests, runs the tests under a configuration it
owns, and reads each outcome from pytest's own reports.

1. The tree (`graded_tree.build`): the base snapshot, plus the model patch's changes to *source* files
   (`allow_list`; everything else the patch changes is left out and named in `GradeResult.neutralised`), plus the
   instance's test patch applied to the snapshot's versions of its files. The grader parses and applies both
   patches itself (unified diffs only; `patches`), reading the snapshot from the dataset's git objects
   (`base_tree`): no `git apply`, no fuzzy `patch`, no git filters, hooks or attributes, no episode `.git`. A
   patch that is not a unified diff, or whose source changes do not apply, is graded 0.
2. The run (`pytest_report.py`, inside a fresh sandbox): pytest with `-c` naming the snapshot's own pytest
   configuration (`graded_tree.pytest_config`) copied outside the tree, `--rootdir /testbed`, no cache provider,
   no plugin autoload, no `PYTEST_ADDOPTS`; outcomes come from pytest's per-phase reports, one nonce-tagged JSON
   line through a copy of the original stdout.
3. The verdict: each FAIL_TO_PASS / PASS_TO_PASS id must be PASSED, or the outcome the instance declares for it
   (`meta.expected_outcomes`, e.g. {"tests/x.py::test_y": "XFAIL"}); XFAIL, XPASS and SKIPPED pass nowhere else.
   A run in which code under test reached into the test machinery (replaced pytest's, pluggy's or builtins'
   attributes, left a trace or profile function set, registered a hook from a changed file or from exec'd code) is
   `verdict="tampered"`, reward 0.

Outcomes map to trajectory statuses the trainer understands:
  OK          graded; reward 1 or 0. `verdict` says which: resolved, unresolved, tampered, timeout (the tests of a
              tree with source changes ran past `test_timeout_s` while the snapshot's own tests finish in time:
              hanging is the patch's doing), refused (not a unified diff, does not apply, an episode limit).
  TIMEOUT     the tests timed out without source changes, or the snapshot's own tests time out as well (void).
  ENV_ERROR   the grader could not set up: the snapshot cannot be read or cloned, the test patch does not apply.
Everything the model wrote runs only in a fresh sandbox.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import pathlib
import secrets
import shlex
import time

from sao.rollout.envs.swe import command_output
from sao.rollout.envs.swe import graded_tree
from sao.rollout.envs.swe import patches
from sao.rollout.envs.swe import pytest_report
from sao.rollout.envs.swe import sandbox as sandbox_lib
from sao.rollout.envs.swe import snapshots
from sao.rollout.envs.swe.base_tree import BaseTree
from sao.rollout.envs.swe.dataset import Instance
from sao.transport.trajectory import Status

_OUTCOMES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")
# Grading output is parsed, not shown to a model: keep much more of it.
GRADER_OUTPUT_BYTES = 4 << 20
DEFAULT_PYTEST_ARGS = ("-q",)
# Runs inside the grading sandbox with `-c <source>` (see its module).
_RUNNER_SOURCE = pathlib.Path(pytest_report.__file__).read_text(encoding="utf-8")
VERDICTS = ("resolved", "unresolved", "tampered", "timeout", "refused", "void")


@dataclasses.dataclass(frozen=True)
class GradeResult:
  """A graded patch.

  Attributes:
    status: `Status.OK` when graded, `Status.TIMEOUT` / `Status.ENV_ERROR` when the grade is void (see module).
    reward: 1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passed; 0.0 otherwise (and when void).
    tests: test id -> passed, for every FAIL_TO_PASS and PASS_TO_PASS id (empty when tests did not run).
    patch_applied: whether the model patch's source changes applied (an empty patch applies trivially).
    detail: one line on why, for logs.
    duration_s: wall-clock seconds of the whole grading.
    neutralised: the paths the model patch changed that the graded tree leaves out (test code, settings, hidden
      paths, ...: `allow_list`); a sign of reward hacking when not empty, empty for an empty patch.
    verdict: one of `VERDICTS` (see the module docstring); "tampered" names the findings in `detail`.
  """
  status: Status
  reward: float
  tests: dict[str, bool] = dataclasses.field(default_factory=dict)
  patch_applied: bool = False
  detail: str = ""
  duration_s: float = 0.0
  neutralised: tuple[str, ...] = ()
  verdict: str = "unresolved"

  @property
  def resolved(self) -> bool:
    return self.status == Status.OK and self.reward == 1.0


def expected_outcomes(instance: Instance) -> dict[str, frozenset[str]]:
  """test id -> the outcome words that pass it besides PASSED, as the instance declares them in
  `meta.expected_outcomes` (a word or a list of words per id); malformed entries are ignored."""
  meta = instance.extra.get("meta")
  declared = meta.get("expected_outcomes") if isinstance(meta, dict) else None
  out = {}
  for test_id, words in (declared.items() if isinstance(declared, dict) else ()):
    words = [words] if isinstance(words, str) else words if isinstance(words, list) else []
    out[str(test_id)] = frozenset(w for w in words if w in _OUTCOMES)
  return out


async def _run_tests(box: sandbox_lib.Sandbox, files: list[str], pytest_args: tuple[str, ...], timeout_s: float,
                     config: tuple[str, str], changed: tuple[str, ...]
                     ) -> tuple[command_output.CommandResult, dict | None]:
  """Runs pytest on `files` under the grader's runner: (the command's result, the report {"outcomes": id -> word,
  "tampering": [findings]}, or None when not exactly one report came back — the run crashed or was killed, or
  something printed a second one)."""
  nonce = secrets.token_hex(16)
  request = {"nonce": nonce, "args": [*pytest_args, *files], "config": list(config), "changed": list(changed)}
  # As `python -m pytest`: the working directory (/testbed) is first on sys.path, so the repository imports.
  run = await box.arun(f"python -c {shlex.quote(_RUNNER_SOURCE)}", stdin=json.dumps(request).encode(),
                       timeout_s=timeout_s, max_output_bytes=GRADER_OUTPUT_BYTES)
  reports = [line for line in run.output.splitlines() if line.startswith(nonce + " ")]
  if len(reports) != 1:  # none (a crash, os._exit) or a second one (forged): no result
    return run, None
  try:
    report = json.loads(reports[0][len(nonce) + 1:])
    return run, {"outcomes": dict(report["outcomes"]), "tampering": list(report["tampering"])}
  except (ValueError, KeyError, TypeError):
    return run, None


async def _test_run(instance: Instance, source: str, tree: graded_tree.GradedTree, config: sandbox_lib.SandboxConfig,
                    pytest_args: tuple[str, ...], timeout_s: float, pytest_config: tuple[str, str]):
  """(command result, report) of the instance's tests in a fresh sandbox holding `tree`."""
  box = await sandbox_lib.Sandbox.acreate(source, instance.base_commit, config, "sao_grade_", overlay=tree.overlay,
                                          pool="grader")
  try:
    ids = list(dict.fromkeys(instance.fail_to_pass + instance.pass_to_pass))
    files = list(dict.fromkeys(t.split("::")[0] for t in ids))
    return await _run_tests(box, files, pytest_args, timeout_s, pytest_config, tree.source_changed)
  finally:
    box.close()


async def agrade(instance: Instance, model_patch: str, config: sandbox_lib.SandboxConfig,
                 test_timeout_s: float = 300.0, pytest_args: tuple[str, ...] = DEFAULT_PYTEST_ARGS) -> GradeResult:
  """Grades `model_patch` (a unified diff against `base_commit`) on `instance`. Never raises for what the patch
  does."""
  start = time.monotonic()
  neutralised: tuple[str, ...] = ()

  def result(status, reward=0.0, verdict="unresolved", **kw):
    if status != Status.OK:
      verdict = "void"
    return GradeResult(status=status, reward=reward, duration_s=time.monotonic() - start, neutralised=neutralised,
                       verdict=verdict, **kw)

  try:
    source = await asyncio.to_thread(snapshots.git_source, instance.snapshot)
    base = await asyncio.to_thread(BaseTree.open, source, instance.base_commit)
  except Exception as e:  # noqa: BLE001 — any setup failure voids the grade; the caller logs `detail`
    return result(Status.ENV_ERROR, detail=f"setup failed: {type(e).__name__}: {e}")
  try:
    tree = await asyncio.to_thread(graded_tree.build, instance, model_patch, base)
  except graded_tree.ModelPatchError as e:
    return result(Status.OK, verdict="refused", detail=str(e)[:300])
  except graded_tree.TestPatchError as e:
    return result(Status.ENV_ERROR, detail=str(e)[:300])
  except Exception as e:  # noqa: BLE001 — the snapshot could not be read
    return result(Status.ENV_ERROR, detail=f"cannot build the graded tree: {type(e).__name__}: {e}")
  neutralised = tree.neutralised
  ids = list(dict.fromkeys(instance.fail_to_pass + instance.pass_to_pass))
  files = list(dict.fromkeys(t.split("::")[0] for t in ids))
  pytest_config = await asyncio.to_thread(graded_tree.pytest_config, base, files)
  try:
    run, report = await _test_run(instance, source, tree, config, pytest_args, test_timeout_s, pytest_config)
    if run.limit:
      return result(Status.OK, patch_applied=True, verdict="refused",
                    detail=f"tests exceeded the episode's {run.limit} limit")
    if run.timed_out:
      if not tree.source_changed:
        return result(Status.TIMEOUT, patch_applied=True, detail=f"tests exceeded {test_timeout_s}s")
      # Hanging must not be a way out of a 0: unless the snapshot's own tests hang too, it is the patch's doing.
      base_tree = await asyncio.to_thread(graded_tree.build, instance, "", base)
      base_run, _ = await _test_run(instance, source, base_tree, config, pytest_args, test_timeout_s, pytest_config)
      if base_run.timed_out:
        return result(Status.TIMEOUT, patch_applied=True,
                      detail=f"tests exceeded {test_timeout_s}s, also without the patch")
      return result(Status.OK, patch_applied=True, verdict="timeout",
                    detail=f"tests exceeded {test_timeout_s}s with the patch's source changes (not without them)")
  except sandbox_lib.SandboxError as e:
    return result(Status.ENV_ERROR, detail=f"sandbox failed: {e}")
  if report is None:
    tail = run.output.strip().splitlines()[-1:] or ["no output"]
    return result(Status.OK, patch_applied=True, detail=f"the test run gave no report: {tail[0][:200]}")
  if report["tampering"]:
    return result(Status.OK, patch_applied=True, verdict="tampered",
                  detail="code under test reached into the test machinery: " + "; ".join(report["tampering"])[:300])
  outcomes, allowed = report["outcomes"], expected_outcomes(instance)
  tests = {t: outcomes.get(t) == "PASSED" or outcomes.get(t) in allowed.get(t, ()) for t in ids}
  failing = [t for t, ok in tests.items() if not ok]
  if failing:
    return result(Status.OK, tests=tests, patch_applied=True,
                  detail=f"{len(failing)} failing, e.g. {failing[0]} ({outcomes.get(failing[0], 'missing')})")
  return result(Status.OK, 1.0, tests=tests, patch_applied=True, verdict="resolved", detail="all tests pass")


def grade(instance: Instance, model_patch: str, config: sandbox_lib.SandboxConfig, test_timeout_s: float = 300.0,
          pytest_args: tuple[str, ...] = DEFAULT_PYTEST_ARGS) -> GradeResult:
  """Synchronous `agrade` (for threads without a running event loop)."""
  return asyncio.run(agrade(instance, model_patch, config, test_timeout_s, pytest_args))
