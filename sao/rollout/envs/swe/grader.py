"""SWE-bench grading: apply the episode's patch and the hidden `test_patch` to a clean checkout, run the tests.

As SWE-bench's harness: the model patch is applied first (`git apply`, then `patch --fuzz` as a fallback); the
files the test patch touches are reset to `base_commit` (so an agent's edits to those tests cannot block or game
it) and the test patch is applied; the test files are run with pytest and each FAIL_TO_PASS / PASS_TO_PASS id is
looked up in the `-rA` report (PASSED and XFAIL count as passing; a missing id fails). Reward 1 iff every id passes.

Outcomes map to trajectory statuses the trainer understands:
  OK          graded; reward 1 or 0 (a patch that does not apply, or breaks collection, is reward 0: it is the
              policy's doing).
  TIMEOUT     the test run hit its wall-clock limit (dropped by the trainer, not reward 0).
  ENV_ERROR   the grader could not set up: the snapshot cannot be cloned, the test patch does not apply to a
              clean checkout (dropped).
Everything runs in a fresh sandbox: the model's code executes only there.
"""
from __future__ import annotations

import asyncio
import dataclasses
import re
import shlex
import time

from sao.rollout.envs.swe import sandbox as sandbox_lib
from sao.rollout.envs.swe.dataset import Instance
from sao.transport.trajectory import Status

# -rA summary lines: "PASSED tests/test_a.py::test_b", "FAILED tests/test_a.py::test_c - AssertionError: ...".
_RESULT_RE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (\S+)(?: - .*)?$", re.MULTILINE)
_PASSING = ("PASSED", "XFAIL")
_DIFF_FILE_RE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
# Grading output is parsed, not shown to a model: keep much more of it.
GRADER_OUTPUT_BYTES = 4 << 20
DEFAULT_TEST_CMD = "python -m pytest -rA -p no:cacheprovider -q"


@dataclasses.dataclass(frozen=True)
class GradeResult:
  """A graded patch.

  Attributes:
    status: `Status.OK` when graded, `Status.TIMEOUT` / `Status.ENV_ERROR` when the grade is void (see module).
    reward: 1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passed; 0.0 otherwise (and when void).
    tests: test id -> passed, for every FAIL_TO_PASS and PASS_TO_PASS id (empty when tests did not run).
    patch_applied: whether the model patch applied (an empty patch applies trivially).
    detail: one line on why, for logs.
    duration_s: wall-clock seconds of the whole grading.
  """
  status: Status
  reward: float
  tests: dict[str, bool] = dataclasses.field(default_factory=dict)
  patch_applied: bool = False
  detail: str = ""
  duration_s: float = 0.0

  @property
  def resolved(self) -> bool:
    return self.status == Status.OK and self.reward == 1.0


def parse_pytest_report(output: str) -> dict[str, str]:
  """test id -> the pytest outcome word, from `-rA` summary lines (the last word wins for a repeated id)."""
  return {test_id: outcome for outcome, test_id in _RESULT_RE.findall(output)}


def patched_files(diff: str) -> list[str]:
  """The paths a git diff touches (new paths of renames included), in order, without repeats."""
  out = []
  for a, b in _DIFF_FILE_RE.findall(diff):
    for path in (a, b):
      if path not in out:
        out.append(path)
  return out


async def _apply(box: sandbox_lib.Sandbox, patch: str, fuzzy: bool) -> tuple[bool, str]:
  """Applies `patch` in the sandbox; with `fuzzy`, falls back to `patch --fuzz` (as SWE-bench does for model
  patches; the dataset's own test patch must apply exactly)."""
  if not patch.strip():
    return True, "empty patch"
  data = patch.encode() if patch.endswith("\n") else (patch + "\n").encode()
  result = await box.arun("git apply --verbose -", stdin=data)
  if result.exit_code == 0:
    return True, "git apply"
  if not fuzzy:
    return False, (result.output.strip().splitlines() or ["git apply failed"])[-1][:300]
  fallback = await box.arun("patch --batch --fuzz=5 -p1 --forward", stdin=data)
  if fallback.exit_code == 0:
    return True, "patch --fuzz"
  return False, (result.output.strip().splitlines() or ["git apply failed"])[-1][:300]


async def agrade(instance: Instance, model_patch: str, config: sandbox_lib.SandboxConfig,
                 test_timeout_s: float = 300.0, test_cmd: str = DEFAULT_TEST_CMD) -> GradeResult:
  """Grades `model_patch` (a git diff against `base_commit`) on `instance`. Never raises for what the patch does."""
  start = time.monotonic()

  def result(status, reward=0.0, **kw):
    return GradeResult(status=status, reward=reward, duration_s=time.monotonic() - start, **kw)

  try:
    source = await asyncio.to_thread(instance.snapshot.git_source)
    box = await sandbox_lib.Sandbox.acreate(source, instance.base_commit, config, "sao_grade_")
  except Exception as e:  # noqa: BLE001 — any setup failure voids the grade; the caller logs `detail`
    return result(Status.ENV_ERROR, detail=f"setup failed: {type(e).__name__}: {e}")
  try:
    applied, how = await _apply(box, model_patch, fuzzy=True)
    if not applied:
      return result(Status.OK, detail=f"model patch does not apply: {how}")
    test_files = patched_files(instance.test_patch)
    if test_files:
      # Files the test patch creates do not exist at base_commit: reset only the ones that do.
      reset = await box.arun(
          f"for f in {' '.join(shlex.quote(f) for f in test_files)}; do "
          f"if git cat-file -e {shlex.quote(instance.base_commit)}:\"$f\" 2>/dev/null; then "
          f"git checkout -q {shlex.quote(instance.base_commit)} -- \"$f\"; else rm -f -- \"$f\"; fi; done")
      if reset.exit_code != 0:
        return result(Status.ENV_ERROR, patch_applied=True, detail=f"cannot reset test files: {reset.output[-300:]}")
    ok, how = await _apply(box, instance.test_patch, fuzzy=False)
    if not ok:
      return result(Status.ENV_ERROR, patch_applied=True, detail=f"test_patch does not apply: {how}")
    ids = list(dict.fromkeys(instance.fail_to_pass + instance.pass_to_pass))
    files = list(dict.fromkeys(t.split("::")[0] for t in ids))
    run = await box.arun(f"{test_cmd} {' '.join(shlex.quote(f) for f in files)}", timeout_s=test_timeout_s,
                         max_output_bytes=GRADER_OUTPUT_BYTES)
    if run.timed_out:
      return result(Status.TIMEOUT, patch_applied=True, detail=f"tests exceeded {test_timeout_s}s")
    report = parse_pytest_report(run.output)
    tests = {t: report.get(t) in _PASSING for t in ids}
    failing = [t for t, ok in tests.items() if not ok]
    reward = 0.0 if failing else 1.0
    detail = ("all tests pass" if not failing
              else f"{len(failing)} failing, e.g. {failing[0]} ({report.get(failing[0], 'missing')})")
    return result(Status.OK, reward, tests=tests, patch_applied=True, detail=detail)
  except sandbox_lib.SandboxError as e:
    return result(Status.ENV_ERROR, detail=f"sandbox failed: {e}")
  finally:
    box.close()


def grade(instance: Instance, model_patch: str, config: sandbox_lib.SandboxConfig, test_timeout_s: float = 300.0,
          test_cmd: str = DEFAULT_TEST_CMD) -> GradeResult:
  """Synchronous `agrade` (for threads without a running event loop)."""
  return asyncio.run(agrade(instance, model_patch, config, test_timeout_s, test_cmd))
