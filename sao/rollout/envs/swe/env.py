"""The "swe" environment: resolve a GitHub-style issue in a sandboxed repository, graded like SWE-bench.

Tools (OpenAI function schemas in `SweEnv.tool_schemas`):
  bash(command)                      runs `command` with `bash -c` in /testbed (a fresh shell each call; timeout,
                                     CPU/memory limits, output truncated with a marker); observation = output, plus
                                     "[exit code N]" / "[command timed out ...]".
  str_replace_editor(command, path, file_text?, old_str?, new_str?, insert_line?, view_range?)
                                     OpenHands' editor: view / create / str_replace / insert (see tools/editor.py).
  submit()                           ends the episode; the repository's diff against base_commit is graded.

Synchronous use (as `Env`; the agent loop runs these in a worker thread via `asyncio.to_thread`):

    env = envs.make("swe")                                    # generated dataset; or make("swe", jsonl=..., ...)
    task = env.tasks("train", 1, seed=0)[0]
    messages = env.reset(task)                                # [system, user]; creates the episode's sandbox
    obs, done = env.step(ToolCall("bash", {"command": "python -m pytest -q"}))
    obs, done = env.step(ToolCall("str_replace_editor", {"command": "view", "path": "/testbed/README.md"}))
    obs, done = env.step(ToolCall("submit", {}))              # grades; done=True
    reward = env.score()                                      # 1.0 iff FAIL_TO_PASS and PASS_TO_PASS all pass
    env.close()                                               # deletes the episode directory (also on reset/GC)

Asynchronous use (scaffolds on an event loop; cancellation kills the running command and deletes the episode):

    messages = await env.areset(task)
    obs, done = await env.astep(call)                         # same rules as step(): turns, error observations
    reward = await env.ascore()
    await env.aclose()

A void grade (the tests timed out, or the grader could not set up) makes `score()` raise `GradeVoidError`; the agent
loop turns that into an `env_error` trajectory, which the trainer drops. `env.grade_result.status` holds the
precise status (`Status.TIMEOUT` or `Status.ENV_ERROR`). Sandbox failures raise `SandboxError` (likewise dropped).

Config (`envs.make("swe", **config)`): `jsonl` + `snapshot_root` for SWE-bench data (default: the generated
dataset of `num_repos` repositories), `max_turns`, per-command `command_timeout_s`, `cpu_s`, `memory_mb`,
`max_output_bytes`, `test_timeout_s` (grading), `isolation` ("bwrap", or "none" to run unsandboxed — explicit only),
`autosubmit` (grade the working tree when the episode ends without `submit`; default True, as SWE-agent does),
`max_processes`, `disk_mb` (how much the repository may grow over the episode: past it, the episode ends with reward
0 and `grade_result.detail` naming the limit), `max_inodes` (as `disk_mb`, in files, directories and symlinks),
`sandbox_memory_mb` (all the sandbox's processes together, where the host has memory cgroups), `tmp_mb` (each
command's /tmp); see `SandboxConfig`.
"""
from __future__ import annotations

import asyncio
import json
import pathlib
import shlex
from typing import Any

import numpy as np

from sao.rollout import tool_format
from sao.rollout.envs.base import SPLITS, Env, Task, split_of
from sao.rollout.envs.registry import register
from sao.rollout.envs.swe import command_output
from sao.rollout.envs.swe import dataset as dataset_lib
from sao.rollout.envs.swe import expert as expert_lib
from sao.rollout.envs.swe import grader as grader_lib
from sao.rollout.envs.swe import sandbox as sandbox_lib
from sao.rollout.envs.swe import snapshots
from sao.rollout.envs.swe.base_tree import BaseTree
from sao.rollout.envs.swe.workspace import DiffTooLargeError, workspace_diff
from sao.rollout.envs.swe.tools import editor as editor_lib
from sao.rollout.tool_format import ToolCall, ToolCallError
from sao.transport.trajectory import Status

# The editor runs inside the sandbox as `python -c <source>` (see tools/editor.py).
_EDITOR_SOURCE = pathlib.Path(editor_lib.__file__).read_text(encoding="utf-8")
_DIFF_BYTES = 8 << 20

SYSTEM_PROMPT = ("You are a software engineer working in a Linux sandbox. The repository is at /testbed. Use the "
                 "tools to inspect and edit it and to run commands; call submit when the issue is resolved.")

USER_TEMPLATE = """<uploaded_files>
/testbed
</uploaded_files>
I've uploaded a python code repository in the directory /testbed. Consider the following issue description:

<issue_description>
{problem_statement}
</issue_description>

Make the minimal changes to non-test files in /testbed so that the issue is resolved. I've already taken care of \
any changes to test files, so you don't have to modify the tests. Reproduce the issue, fix it, check the fix, then \
call submit."""

TOOL_SCHEMAS = [
    tool_format.function_tool(
        "bash", "Run a bash command in /testbed (fresh shell each call; output is truncated; commands time out).",
        {"command": {"type": "string", "description": "the bash command to run"}}),
    tool_format.function_tool(
        "str_replace_editor",
        "View, create and edit files. `view` shows a file with line numbers (or a directory 2 levels deep); `create` "
        "writes a new file; `str_replace` replaces `old_str`, which must occur exactly once, with `new_str`; "
        "`insert` inserts `new_str` after line `insert_line`. Paths are absolute.",
        {"command": {"type": "string", "enum": list(editor_lib.COMMANDS), "description": "the editor command"},
         "path": {"type": "string", "description": "absolute path of a file or directory, e.g. /testbed/x.py"},
         "file_text": {"type": "string", "description": "create: the new file's content"},
         "old_str": {"type": "string", "description": "str_replace: the exact text to replace"},
         "new_str": {"type": "string", "description": "str_replace: the replacement; insert: the text to insert"},
         "insert_line": {"type": "integer", "description": "insert: insert after this line (0 = top)"},
         "view_range": {"type": "array", "items": {"type": "integer"},
                        "description": "view: [start, end] lines, end -1 for the end of the file"}},
        required=["command", "path"]),
    tool_format.function_tool("submit", "Submit the current state of /testbed for grading and end the episode."),
]


class GradeVoidError(RuntimeError):
  """The episode's grade is void (tests timed out, grader setup failed): not a 0 reward, a dropped trajectory."""

  def __init__(self, result: grader_lib.GradeResult):
    self.result = result
    super().__init__(f"grade void ({result.status}): {result.detail}")


def _run_sync(coro):
  try:
    asyncio.get_running_loop()
  except RuntimeError:
    return asyncio.run(coro)
  coro.close()
  raise RuntimeError("SweEnv: synchronous method called on a running event loop; use the a* methods "
                     "(areset/astep/ascore/aclose) or asyncio.to_thread")


@register("swe")
class SweEnv(Env):
  """SWE-bench-style issue resolution in a bubblewrap sandbox; see the module docstring."""
  name = "swe"
  system_prompt = SYSTEM_PROMPT
  tool_schemas = TOOL_SCHEMAS

  def __init__(self, jsonl: str | None = None, snapshot_root: str | None = None, num_repos: int = 240,
               max_turns: int = 30, command_timeout_s: float = 30.0, cpu_s: int = 60, memory_mb: int = 4096,
               max_output_bytes: int = 10_000, test_timeout_s: float = 120.0, isolation: str = "bwrap",
               sandbox_root: str | None = None, autosubmit: bool = True,
               pytest_args: tuple[str, ...] = grader_lib.DEFAULT_PYTEST_ARGS, max_processes: int = 512,
               disk_mb: int = 1024, tmp_mb: int = 512, max_inodes: int = 100_000, sandbox_memory_mb: int = 8192):
    super().__init__()
    if max_turns < 1:
      raise ValueError(f"max_turns: must be >= 1, got {max_turns}")
    if (jsonl is None) != (snapshot_root is None):
      raise ValueError("jsonl and snapshot_root go together (SWE-bench data), or neither (the generated dataset)")
    if num_repos < 1:
      raise ValueError(f"num_repos: must be >= 1, got {num_repos}")
    self.jsonl, self.snapshot_root, self.num_repos = jsonl, snapshot_root, int(num_repos)
    self.config_max_turns = int(max_turns)
    self.sandbox_config = sandbox_lib.SandboxConfig(
        timeout_s=command_timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes,
        isolation=isolation, root=sandbox_root, max_processes=max_processes, disk_mb=disk_mb, tmp_mb=tmp_mb,
        max_inodes=max_inodes, sandbox_memory_mb=sandbox_memory_mb)
    self.test_timeout_s = float(test_timeout_s)
    self.autosubmit = bool(autosubmit)
    self.pytest_args = tuple(pytest_args)
    self.instance: dataset_lib.Instance | None = None
    self.sandbox: sandbox_lib.Sandbox | None = None
    self.grade_result: grader_lib.GradeResult | None = None
    self.submitted = False
    self._expert = None
    self._pool: list[Task] | None = None

  # ----------------------------------------------------------------------------------------------------------------
  # Tasks.

  def task_pool(self) -> list[Task]:
    if self._pool is None:
      if self.jsonl is not None:
        instances = dataset_lib.load_jsonl(self.jsonl, self.snapshot_root)
        self._pool = [i.to_task(max_turns=self.config_max_turns) for i in instances]
      else:
        from sao.rollout.envs.swe import generator  # lazily: SWE-bench data does not need it
        self._pool = [dict(t, max_turns=self.config_max_turns) for t in generator.tasks(self.num_repos)]
    return self._pool

  def split_pool(self, split: str) -> list[Task]:
    """The tasks of `split`, split by repository (`split_of(repo)`: no repository is in two splits); for the generated
    dataset, without generating the other splits' repositories."""
    if split not in SPLITS:
      raise ValueError(f"split: {split!r} is not one of {SPLITS}")
    if self.jsonl is None and self._pool is None:
      from sao.rollout.envs.swe import generator
      return [dict(t, max_turns=self.config_max_turns) for t in generator.tasks(self.num_repos, split)]
    return [t for t in self.task_pool() if split_of(t["instance"]["repo"]) == split]

  # ----------------------------------------------------------------------------------------------------------------
  # Episode (async core; the synchronous Env methods wrap it).

  @staticmethod
  def snapshot_source(task: Task) -> str:
    """The local git source of `task`'s repository (materializing a generated one into the cache, once)."""
    return snapshots.git_source(dataset_lib.Instance.from_task(task).snapshot)

  async def areset(self, task: Task) -> list[dict[str, str]]:
    """Async `reset`: closes any previous episode, clones a fresh sandbox."""
    if task.get("env") != self.name:
      raise ValueError(f"task['env']: {task.get('env')!r} is not a {self.name!r} task")
    await self.aclose()
    instance = dataset_lib.Instance.from_task(task)
    source = await asyncio.to_thread(snapshots.git_source, instance.snapshot)
    box = await sandbox_lib.Sandbox.acreate(source, instance.base_commit, self.sandbox_config)
    self.task, self.instance, self.sandbox = task, instance, box
    self.turns, self.max_turns, self.done = 0, int(task["max_turns"]), False
    self.grade_result, self.submitted = None, False
    self._expert = None
    user = USER_TEMPLATE.format(problem_statement=instance.problem_statement)
    return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": user}]

  def _reset(self, task: Task) -> str:
    raise AssertionError("unreachable: SweEnv.reset is overridden")

  def reset(self, task: Task) -> list[dict[str, str]]:
    return _run_sync(self.areset(task))

  async def astep(self, call: ToolCall | ToolCallError) -> tuple[str, bool]:
    """Async `step`: the same turn accounting and error observations as `Env.step`."""
    if self.done:
      raise RuntimeError(f"{self.name}: step() after the episode ended (turns={self.turns}); call reset()")
    self.turns += 1
    try:
      if isinstance(call, ToolCallError):
        observation = call.observation
      else:
        problem = self._check_call(call)
        observation, self.done = (f"error: {problem}", False) if problem else await self._astep(call)
    except asyncio.CancelledError:
      # A cancelled episode cannot be resumed (its command was killed mid-way): free its directory now.
      await self.aclose()
      raise
    if self.turns >= self.max_turns:
      self.done = True
    if self._expert is not None and isinstance(call, ToolCall):
      self._expert.observe(call, observation)
    return observation, self.done

  def step(self, call: ToolCall | ToolCallError) -> tuple[str, bool]:
    return _run_sync(self.astep(call))

  def _step(self, call: ToolCall) -> tuple[str, bool]:
    raise AssertionError("unreachable: SweEnv.step is overridden")

  async def _astep(self, call: ToolCall) -> tuple[str, bool]:
    if self.sandbox is None:
      raise RuntimeError(f"{self.name}: no sandbox; call reset()")
    if call.name == "bash":
      result = await self.sandbox.arun(call.arguments["command"])
      return self._end_if_spent(result, result.observation())
    if call.name == "str_replace_editor":
      return await self._edit(dict(call.arguments))
    if call.name == "submit":
      self.submitted = True
      await self._grade()
      return "Submitted. The episode is over.", True
    raise AssertionError(f"unreachable: {call.name!r} passed the schema check")

  async def _edit(self, request: dict[str, Any]) -> tuple[str, bool]:
    result = await self.sandbox.arun(f"python3 -I -S -c {shlex.quote(_EDITOR_SOURCE)}",
                                     stdin=json.dumps(request).encode(),
                                     max_output_bytes=max(self.sandbox_config.max_output_bytes, 2 * 16000))
    return self._end_if_spent(result, result.observation() if result.timed_out or result.limit else result.output)

  def _end_if_spent(self, result: command_output.CommandResult, observation: str) -> tuple[str, bool]:
    """(observation, done): a command that exceeded an episode limit (the repository outgrew `disk_mb`) ends the
    episode, graded 0 without running its tests — the policy's doing, with the limit named in the grade's detail."""
    if not result.limit:
      return observation, False
    detail = f"episode ended: the sandbox's {result.limit} limit was exceeded"
    self.grade_result = grader_lib.GradeResult(status=Status.OK, reward=0.0, detail=detail, verdict="refused")
    self.submitted = True
    return f"{observation}\n[{detail}]", True

  async def diff(self) -> str:
    """The working tree's changes against base_commit as a unified diff, computed on the host from the files'
    contents and the dataset's own git objects (`workspace_diff`): the episode's .git, its filters, hooks and
    attributes are never consulted, and nothing runs in the sandbox."""
    source = await asyncio.to_thread(snapshots.git_source, self.instance.snapshot)
    base = await asyncio.to_thread(BaseTree.open, source, self.instance.base_commit)
    try:
      return await asyncio.to_thread(workspace_diff, self.sandbox.repo_dir, base, _DIFF_BYTES)
    except DiffTooLargeError:
      # The agent wrote more than a patch can hold: a wrong answer, graded as one.
      return ("diff --git a/.sao_unreadable b/.sao_unreadable\n"
              "Binary files a/.sao_unreadable and b/.sao_unreadable differ\n")

  async def _grade(self) -> grader_lib.GradeResult:
    if self.grade_result is None:
      patch = await self.diff()
      self.grade_result = await grader_lib.agrade(self.instance, patch, self.sandbox_config, self.test_timeout_s,
                                                  self.pytest_args)
    return self.grade_result

  async def ascore(self) -> float:
    """1.0 iff the graded patch resolves the issue; raises `GradeVoidError` when the grade is void."""
    if self.instance is None:
      raise RuntimeError(f"{self.name}: score() before reset()")
    if not self.submitted and not self.autosubmit:
      return 0.0
    if self.grade_result is None and self.sandbox is None:
      raise RuntimeError(f"{self.name}: the episode's sandbox was closed before it was graded")
    result = await self._grade()
    if result.status != Status.OK:
      raise GradeVoidError(result)
    return result.reward

  def score(self) -> float:
    return _run_sync(self.ascore())

  async def aclose(self) -> None:
    self.close()

  def close(self) -> None:
    """Deletes the episode's directory (idempotent; reset() and garbage collection also do it)."""
    if self.sandbox is not None:
      self.sandbox.close()
      self.sandbox = None

  # ----------------------------------------------------------------------------------------------------------------
  # Scripted expert.

  def expert_action(self) -> ToolCall:
    """The scripted expert's next call (see `expert.py`); it follows the episode's calls, noisy ones included."""
    if self._expert is None:
      self._expert = expert_lib.Expert(self.task, self.instance)
    return self._expert.next_call()

  def noisy_action(self, rng: np.random.Generator) -> ToolCall:
    return expert_lib.noisy_call(rng, self.instance)
