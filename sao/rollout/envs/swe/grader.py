"""SWE-bench grading: apply the episode's patch and the hidden `test_patch` to a clean checkout, run the tests.

As SWE-bench's harness: the model patch is applied first (`git apply`, then `patch --fuzz` as a fallback; a patch
naming a path inside `.git` is refused); every piece of test infrastructure the patch changed — conftests, test
settings, start-up hooks, test files, compiled Python, the repository's own pytest plugins, modules shadowing the
standard library or pytest — is reverted to `base_commit` (`infra_guard.py`), so it cannot change the grade; the
files the test patch touches are reset and the test patch is applied; the test files are run with pytest under the
grader's own reporting plugin (`pytest_report.py`: outcomes from pytest's per-phase reports, not from text the
tests print) and each FAIL_TO_PASS / PASS_TO_PASS id is looked up (PASSED and XFAIL count as passing; a missing id
fails). Reward 1 iff every id passes.

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
import json
import pathlib
import re
import secrets
import shlex
import time

from sao.rollout.envs.swe import pytest_report
from sao.rollout.envs.swe import sandbox as sandbox_lib
from sao.rollout.envs.swe import snapshots
from sao.rollout.envs.swe import infra_guard
from sao.rollout.envs.swe.dataset import Instance
from sao.transport.trajectory import Status

_PASSING = ("PASSED", "XFAIL")
_DIFF_FILE_RE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
# Grading output is parsed, not shown to a model: keep much more of it.
GRADER_OUTPUT_BYTES = 4 << 20
DEFAULT_PYTEST_ARGS = ("-p", "no:cacheprovider", "-q")
# Both run inside the grading sandbox with `-c <source>` (see their modules).
_INFRA_SOURCE = pathlib.Path(infra_guard.__file__).read_text(encoding="utf-8")
_RUNNER_SOURCE = pathlib.Path(pytest_report.__file__).read_text(encoding="utf-8")
_PATCH_PATH_RE = re.compile(r"^(?:diff --git a/(\S+) b/(\S+)|(?:---|\+\+\+) (?:[ab]/)?(\S+)"
                            r"|(?:rename|copy) (?:from|to) (\S+))", re.MULTILINE)


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
    reverted: the test-infrastructure paths the patch changed and the grader reverted (a sign of reward hacking
      when not empty; logged, not penalised).
  """
  status: Status
  reward: float
  tests: dict[str, bool] = dataclasses.field(default_factory=dict)
  patch_applied: bool = False
  detail: str = ""
  duration_s: float = 0.0
  reverted: tuple[str, ...] = ()

  @property
  def resolved(self) -> bool:
    return self.status == Status.OK and self.reward == 1.0


def patched_files(diff: str) -> list[str]:
  """The paths a git diff touches (new paths of renames included), in order, without repeats."""
  out = []
  for a, b in _DIFF_FILE_RE.findall(diff):
    for path in (a, b):
      if path not in out:
        out.append(path)
  return out


def touches_git_dir(diff: str) -> bool:
  """Whether any header of `diff` names a path with a `.git` component (or an absolute or `..` path)."""
  for groups in _PATCH_PATH_RE.findall(diff):
    for path in groups:
      parts = path.split("/")
      if path and path != "/dev/null" and (path.startswith("/") or ".git" in parts or ".." in parts):
        return True
  return False


async def _run_tests(box: sandbox_lib.Sandbox, files: list[str], pytest_args: tuple[str, ...],
                     timeout_s: float) -> tuple[sandbox_lib.CommandResult, dict[str, str] | None]:
  """Runs pytest on `files` under the grader's reporting plugin: (the command's result, id -> outcome word, or None
  when not exactly one report came back — the run crashed or was killed, or something printed a second one)."""
  nonce = secrets.token_hex(16)
  request = {"nonce": nonce, "args": [*pytest_args, *files]}
  run = await box.arun(f"python -c {shlex.quote(_RUNNER_SOURCE)}", stdin=json.dumps(request).encode(),
                       timeout_s=timeout_s, max_output_bytes=GRADER_OUTPUT_BYTES)
  reports = [line for line in run.output.splitlines() if line.startswith(nonce + " ")]
  if len(reports) != 1:  # none (a crash, os._exit) or a second one (forged): no result
    return run, None
  try:
    return run, dict(json.loads(reports[0][len(nonce) + 1:])["outcomes"])
  except (ValueError, KeyError, TypeError):
    return run, None


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
                 test_timeout_s: float = 300.0, pytest_args: tuple[str, ...] = DEFAULT_PYTEST_ARGS) -> GradeResult:
  """Grades `model_patch` (a git diff against `base_commit`) on `instance`. Never raises for what the patch does."""
  start = time.monotonic()
  reverted: tuple[str, ...] = ()

  def result(status, reward=0.0, **kw):
    return GradeResult(status=status, reward=reward, duration_s=time.monotonic() - start, reverted=reverted, **kw)

  try:
    source = await asyncio.to_thread(snapshots.git_source, instance.snapshot)
    box = await sandbox_lib.Sandbox.acreate(source, instance.base_commit, config, "sao_grade_")
  except Exception as e:  # noqa: BLE001 — any setup failure voids the grade; the caller logs `detail`
    return result(Status.ENV_ERROR, detail=f"setup failed: {type(e).__name__}: {e}")
  try:
    if touches_git_dir(model_patch):
      return result(Status.OK, detail="model patch names a path inside .git (or outside the repository)")
    applied, how = await _apply(box, model_patch, fuzzy=True)
    if not applied:
      return result(Status.OK, detail=f"model patch does not apply: {how}")
    infra = await box.arun(f"python3 -I -S -c {shlex.quote(_INFRA_SOURCE)}",
                           stdin=json.dumps({"base": instance.base_commit}).encode())
    if infra.exit_code == 1 and infra.output.startswith(infra_guard.FAILURE):
      # The patch left the tree in a state we cannot restore: the policy's doing.
      return result(Status.OK, patch_applied=True, detail=infra.output.strip()[:300])
    try:
      reverted = tuple(json.loads(infra.output)["reverted"]) if infra.exit_code == 0 else None
    except (ValueError, KeyError, TypeError):
      reverted = None
    if reverted is None:  # our own script failed to run: the sandbox's fault, not the patch's
      reverted = ()
      return result(Status.ENV_ERROR, patch_applied=True, detail=f"infra_guard failed: {infra.observation()[-300:]}")
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
    run, report = await _run_tests(box, files, pytest_args, test_timeout_s)
    if run.limit:
      return result(Status.OK, patch_applied=True, detail=f"tests exceeded the episode's {run.limit} limit")
    if run.timed_out:
      return result(Status.TIMEOUT, patch_applied=True, detail=f"tests exceeded {test_timeout_s}s")
    if report is None:
      tail = run.output.strip().splitlines()[-1:] or ["no output"]
      return result(Status.OK, patch_applied=True, detail=f"the test run gave no report: {tail[0][:200]}")
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
          pytest_args: tuple[str, ...] = DEFAULT_PYTEST_ARGS) -> GradeResult:
  """Synchronous `agrade` (for threads without a running event loop)."""
  return asyncio.run(agrade(instance, model_patch, config, test_timeout_s, pytest_args))
