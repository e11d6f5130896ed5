"""The "swe" environment's tools through `SweEnv.step`: bash, str_replace_editor (OpenHands semantics), submit."""
from __future__ import annotations

import asyncio
import os

import pytest

from sao.rollout import envs, tool_format
from sao.rollout.envs.swe import SweEnv
from sao.rollout.tool_format import ToolCall
from sao.transport.trajectory import Status


@pytest.fixture
def env(calc_dataset):
  jsonl, root, _ = calc_dataset
  env = envs.make("swe", jsonl=str(jsonl), snapshot_root=str(root), max_turns=20, command_timeout_s=10)
  env.reset(env.task_pool()[0])
  yield env
  env.close()


def edit(env, **arguments):
  return env.step(ToolCall("str_replace_editor", arguments))[0]


def test_registered_with_three_tools():
  assert "swe" in envs.registered()
  assert tool_format.tool_names(SweEnv.tool_schemas) == ["bash", "str_replace_editor", "submit"]


def test_first_messages_hold_the_issue(calc_dataset):
  jsonl, root, record = calc_dataset
  env = envs.make("swe", jsonl=str(jsonl), snapshot_root=str(root))
  messages = env.reset(env.task_pool()[0])
  try:
    assert [m["role"] for m in messages] == ["system", "user"]
    assert record["problem_statement"] in messages[1]["content"] and "/testbed" in messages[1]["content"]
  finally:
    env.close()


def test_bash_runs_in_testbed_with_exit_codes(env):
  obs, done = env.step(ToolCall("bash", {"command": "pwd; ls calc"}))
  assert not done and obs.startswith("/testbed\n") and "ops.py" in obs
  obs, _ = env.step(ToolCall("bash", {"command": "echo oops >&2; exit 3"}))
  assert "oops" in obs and "[exit code 3]" in obs
  # History after base_commit (the fix) is not reachable from the episode's copy.
  obs, _ = env.step(ToolCall("bash", {"command": "git log --all --oneline | wc -l; git for-each-ref | wc -l"}))
  assert obs.split() == ["1", "0"]


def test_bash_timeout_and_truncation(calc_dataset):
  jsonl, root, _ = calc_dataset
  env = envs.make("swe", jsonl=str(jsonl), snapshot_root=str(root), command_timeout_s=1, max_output_bytes=1000)
  env.reset(env.task_pool()[0])
  try:
    obs, done = env.step(ToolCall("bash", {"command": "sleep 30"}))
    assert "timed out" in obs and not done
    obs, _ = env.step(ToolCall("bash", {"command": "seq 1 100000"}))
    assert "output truncated" in obs and obs.startswith("1\n2\n") and obs.rstrip().endswith("100000")
    assert len(obs) < 1200
    obs, _ = env.step(ToolCall("bash", {"command": "echo still alive"}))
    assert obs == "still alive\n"
  finally:
    env.close()


def test_editor_view_file_and_range(env):
  obs = edit(env, command="view", path="/testbed/calc/ops.py")
  assert obs.startswith("Here's the result of running `cat -n` on /testbed/calc/ops.py:\n")
  assert "     1\tdef clamp(x, lo, hi):" in obs
  obs = edit(env, command="view", path="/testbed/calc/ops.py", view_range=[5, 6])
  assert "     5\t    if x > hi:\n     6\t        return lo\n" in obs and "     4\t" not in obs
  obs = edit(env, command="view", path="/testbed/calc/ops.py", view_range=[10, -1])
  assert "    10\tdef double(x):" in obs
  assert "Invalid `view_range`" in edit(env, command="view", path="/testbed/calc/ops.py", view_range=[0, 3])
  obs = edit(env, command="view", path="/testbed")
  assert "up to 2 levels deep in /testbed" in obs and "/testbed/calc/ops.py" in obs and ".git" not in obs


def test_editor_str_replace_unique_missing_multiple(env):
  obs = edit(env, command="str_replace", path="/testbed/calc/ops.py", old_str="        return lo\n    return x",
             new_str="        return hi\n    return x")
  assert obs.startswith("The file /testbed/calc/ops.py has been edited.") and "return hi" in obs
  obs = edit(env, command="str_replace", path="/testbed/calc/ops.py", old_str="not there", new_str="x")
  assert "did not appear verbatim" in obs
  obs = edit(env, command="str_replace", path="/testbed/calc/ops.py", old_str="return", new_str="x")
  assert "Multiple occurrences of old_str `return` in lines [4, 6, 7, 11]" in obs
  obs, _ = env.step(ToolCall("bash", {"command": "git diff --stat"}))
  assert "1 insertion(+), 1 deletion(-)" in obs


def test_editor_create_insert_and_errors(env):
  assert edit(env, command="create", path="/testbed/calc/new.py", file_text="A = 1\n") == (
      "File created successfully at: /testbed/calc/new.py")
  assert "Cannot overwrite files using command `create`" in edit(env, command="create", path="/testbed/calc/new.py",
                                                                file_text="B = 2\n")
  obs = edit(env, command="insert", path="/testbed/calc/new.py", insert_line=0, new_str="# header")
  assert "has been edited" in obs and "     1\t# header\n     2\tA = 1" in obs
  assert "Invalid `insert_line` parameter: 9" in edit(env, command="insert", path="/testbed/calc/new.py",
                                                       insert_line=9, new_str="x")
  assert "is not an absolute path" in edit(env, command="view", path="calc/ops.py")
  assert "does not exist" in edit(env, command="view", path="/testbed/nope.py")
  assert "only the `view` command" in edit(env, command="str_replace", path="/testbed/calc", old_str="a")
  assert "Unrecognized command" in edit(env, command="undo_edit", path="/testbed/calc/ops.py")


def test_editor_cannot_escape_through_symlinks(env, tmp_path):
  secret = tmp_path / "secret.txt"
  secret.write_text("host secret\n")
  env.step(ToolCall("bash", {"command": f"ln -s {secret} /testbed/link.txt"}))
  obs = edit(env, command="view", path="/testbed/link.txt")
  assert "host secret" not in obs and "does not exist" in obs  # the link's target is not in the sandbox
  obs = edit(env, command="create", path=str(tmp_path / "planted.txt"), file_text="x")
  assert not (tmp_path / "planted.txt").exists()  # written to the sandbox's private /tmp, if anywhere


def test_bad_calls_are_observations(env):
  obs, done = env.step(ToolCall("bash", {}))
  assert obs == "error: bash: missing argument 'command'" and not done
  obs, _ = env.step(ToolCall("nope", {}))
  assert "unknown tool" in obs


def test_submit_grades_and_ends(env):
  edit(env, command="str_replace", path="/testbed/calc/ops.py", old_str="        return lo\n    return x",
       new_str="        return hi\n    return x")
  obs, done = env.step(ToolCall("submit", {}))
  assert done and env.score() == 1.0 and env.grade_result.status == Status.OK


def test_commits_count_and_a_destroyed_repository_scores_zero(env, calc_dataset):
  edit(env, command="str_replace", path="/testbed/calc/ops.py", old_str="        return lo\n    return x",
       new_str="        return hi\n    return x")
  obs, _ = env.step(ToolCall("bash", {"command": "git commit -qam fix && git log --oneline | wc -l"}))
  assert obs == "2\n"  # the diff against base_commit still holds the committed fix
  env.step(ToolCall("submit", {}))
  assert env.score() == 1.0
  jsonl, root, _ = calc_dataset
  other = envs.make("swe", jsonl=str(jsonl), snapshot_root=str(root))
  other.reset(other.task_pool()[0])
  try:
    other.step(ToolCall("bash", {"command": "rm -rf .git"}))
    other.step(ToolCall("submit", {}))
    assert other.score() == 0.0 and other.grade_result.status == Status.OK
  finally:
    other.close()


def test_unsubmitted_episode_is_autosubmitted_at_max_turns(calc_dataset):
  jsonl, root, _ = calc_dataset
  env = envs.make("swe", jsonl=str(jsonl), snapshot_root=str(root), max_turns=1)
  env.reset(env.task_pool()[0])
  try:
    _, done = env.step(ToolCall("bash", {"command": "true"}))
    assert done and env.score() == 0.0  # graded: the bug is still there
  finally:
    env.close()


def test_a_patch_whose_tests_hang_scores_zero(calc_dataset):
  jsonl, root, _ = calc_dataset
  env = envs.make("swe", jsonl=str(jsonl), snapshot_root=str(root), test_timeout_s=2)
  env.reset(env.task_pool()[0])
  try:
    edit(env, command="str_replace", path="/testbed/calc/ops.py", old_str="def double(x):\n",
         new_str="def double(x):\n    while True:\n        pass\n")
    env.step(ToolCall("submit", {}))
    assert env.score() == 0.0  # trained on: hanging is no way out of a 0 (the snapshot's tests finish in time)
    assert env.grade_result.status == Status.OK and env.grade_result.verdict == "timeout"
  finally:
    env.close()


def test_async_api_and_close(calc_dataset):
  jsonl, root, _ = calc_dataset
  env = envs.make("swe", jsonl=str(jsonl), snapshot_root=str(root))

  async def play():
    await env.areset(env.task_pool()[0])
    episode_dir = env.sandbox.episode_dir
    obs, done = await env.astep(ToolCall("bash", {"command": "echo hi"}))
    assert obs == "hi\n" and not done
    await env.aclose()
    return episode_dir

  episode_dir = asyncio.run(play())
  assert not os.path.exists(episode_dir)


def test_sync_api_from_a_worker_thread(calc_dataset):
  """The agent loop calls reset/step/score through `asyncio.to_thread` from its event loop."""
  jsonl, root, _ = calc_dataset
  env = envs.make("swe", jsonl=str(jsonl), snapshot_root=str(root))

  async def play():
    await asyncio.to_thread(env.reset, env.task_pool()[0])
    obs, _ = await asyncio.to_thread(env.step, ToolCall("bash", {"command": "echo from-thread"}))
    with pytest.raises(RuntimeError, match="running event loop"):
      env.step(ToolCall("bash", {"command": "true"}))  # on the loop itself: a clear error, not a deadlock
    return obs

  try:
    assert asyncio.run(play()) == "from-thread\n"
  finally:
    env.close()
