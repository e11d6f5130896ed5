"""Tests for the environments: registry, rules, splits, determinism, the sandbox, and the scripted experts."""
import json
import signal
import time

import numpy as np
import pytest

from sao.rollout import envs
from sao.rollout import tool_format
from sao.rollout.envs import code_repair_tasks
from sao.rollout.envs import number_search
from sao.rollout.envs import sandbox
from sao.rollout.tool_format import ToolCall

ENV_NAMES = ["number_search", "code_repair"]


def compare(guess):
  return ToolCall("compare", {"guess": guess})


# ------------------------------------------------------------------------------------------------------------------
# Registry and the shared interface.


def test_registry_lists_and_makes_builtin_envs():
  assert set(ENV_NAMES) <= set(envs.registered())
  assert isinstance(envs.make("number_search", n=16), envs.NumberSearch)
  with pytest.raises(KeyError, match="not_an_env"):
    envs.make("not_an_env")


def test_register_refuses_a_second_class_under_a_taken_name():
  with pytest.raises(ValueError, match="number_search"):
    envs.register("number_search")(type("Other", (envs.NumberSearch,), {}))


@pytest.mark.parametrize("name", ENV_NAMES)
def test_declares_prompt_and_openai_tool_schemas(name):
  env = envs.make(name)
  assert 0 < len(env.system_prompt) < 120
  for schema in env.tool_schemas:
    assert schema["type"] == "function"
    params = schema["function"]["parameters"]
    assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])
  json.dumps(env.tool_schemas)


@pytest.mark.parametrize("name", ENV_NAMES)
def test_tasks_are_json_deterministic_and_splits_disjoint(name):
  env = envs.make(name)
  by_split = {split: env.tasks(split, 30, seed=0) for split in envs.SPLITS}
  for split, tasks in by_split.items():
    assert len(tasks) == 30
    assert json.loads(json.dumps(tasks)) == tasks
    assert all(t["env"] == name and envs.split_of(t["key"]) == split for t in tasks)
    assert len({t["task_id"] for t in tasks}) == 30  # unique even when the split's pool is smaller
    assert env.tasks(split, 30, seed=0) == tasks
  assert env.tasks("train", 30, seed=1) != by_split["train"]
  keys = {split: {t["key"] for t in tasks} for split, tasks in by_split.items()}
  assert not keys["train"] & keys["validation"]
  assert not keys["train"] & keys["test"]
  assert not keys["validation"] & keys["test"]
  # Whole pools, whatever the seed: every key lands in exactly one split.
  pool_keys = [t["key"] for t in env.task_pool()]
  assert len(pool_keys) == len(set(pool_keys))
  sizes = {s: sum(envs.split_of(k) == s for k in pool_keys) for s in envs.SPLITS}
  assert all(size > 0 for size in sizes.values()) and sum(sizes.values()) == len(pool_keys)


def test_tasks_rejects_unknown_split():
  with pytest.raises(ValueError, match="split"):
    envs.make("number_search").tasks("dev", 3, seed=0)


def test_split_of_is_stable():
  # A pinned value: the split rule must never change, or old validation tasks would leak into training.
  assert [envs.split_of(f"k{i}") for i in range(8)] == [
      "validation", "train", "train", "train", "train", "train", "train", "test"]


@pytest.mark.parametrize("name", ENV_NAMES)
def test_malformed_calls_become_observations_and_use_turns(name):
  env = envs.make(name)
  task = env.tasks("train", 1, seed=0)[0]
  env.reset(task)
  observations = [
      env.step_text("no call here")[0],
      env.step_text('<tool_call>{"name": "rm", "arguments": {}}</tool_call>')[0],
      env.step(ToolCall("nope", {}))[0],
  ]
  assert all(o.startswith("error: ") for o in observations)
  assert env.turns == 3


@pytest.mark.parametrize("name", ENV_NAMES)
def test_turn_budget_ends_episode_and_step_after_done_raises(name):
  env = envs.make(name, max_turns=2)
  env.reset(env.tasks("train", 1, seed=0)[0])
  assert env.step_text("babble") == ("error: no <tool_call>", False)
  assert env.step_text("babble")[1] is True
  assert env.score() == 0.0
  with pytest.raises(RuntimeError, match="after the episode ended"):
    env.step_text("babble")


def test_reset_rejects_other_envs_task():
  task = envs.make("number_search").tasks("train", 1, seed=0)[0]
  with pytest.raises(ValueError, match="env"):
    envs.make("code_repair").reset(task)


# ------------------------------------------------------------------------------------------------------------------
# number_search.


def test_number_search_rules():
  env = envs.make("number_search", n=64, max_turns=10)
  task = next(t for t in env.task_pool() if t["target"] == 37)
  messages = env.reset(task)
  assert [m["role"] for m in messages] == ["system", "user"]
  assert messages[1]["content"] == "Find the number in 1..64."
  assert env.step(compare(32)) == ("higher", False)
  assert env.step(compare(40)) == ("lower", False)
  assert env.step(compare(0)) == ("error: guess must be in 1..64", False)
  assert env.step(compare("37"))[0].startswith("error: ")  # strings are not integers
  assert env.score() == 0.0
  assert env.step(compare(37)) == ("equal", True)
  assert env.score() == 1.0


def test_number_search_found_on_last_turn_counts():
  env = envs.make("number_search", n=8, max_turns=2)
  env.reset(next(t for t in env.task_pool() if t["target"] == 5))
  assert env.step(compare(1)) == ("higher", False)
  assert env.step(compare(5)) == ("equal", True)
  assert env.score() == 1.0


def test_number_search_default_budget_fits_binary_search():
  env = envs.make("number_search", n=64)
  assert env.config_max_turns == 8  # ceil(log2(65)) = 7, plus one spare


def test_number_search_expert_success_rates():
  env = envs.make("number_search", n=64)
  tasks = env.tasks("train", 64, seed=0)
  rng = np.random.default_rng(0)
  expert = [env.demonstrate(t, rng) for t in tasks]
  assert all(d.reward == 1.0 for d in expert)
  assert max(len(d.calls) for d in expert) <= 7  # binary search's worst case
  noisy = np.mean([env.demonstrate(t, rng, noise=0.5).reward for t in tasks])
  assert 0.05 < noisy < 0.9


def test_number_search_offsets_sizes_and_interval_hint():
  env = envs.make("number_search", sizes=(8, 12), offsets=(0, 20), show_interval=True)
  pool = env.task_pool()
  assert len(pool) == 2 * (8 + 12) and len({t["key"] for t in pool}) == len(pool)
  assert {t["max_turns"] for t in pool if t["n"] == 8} == {5} and {t["max_turns"] for t in pool if t["n"] == 12} == {5}
  # The plain range keeps number_search's original keys, so its tasks keep their splits.
  assert {t["key"] for t in pool if "offset" not in t and t["n"] == 8} == {
      t["key"] for t in envs.make("number_search", n=8).task_pool()}
  task = next(t for t in pool if t.get("offset") == 20 and t["n"] == 12 and t["target"] == 30)
  assert env.reset(task)[1]["content"] == "Find the number in 21..32."
  assert env.step(compare(5)) == ("error: guess must be in 21..32", False)
  assert env.step(compare(26)) == ("higher 27..32", False)
  assert env.step(compare(31)) == ("lower 27..30", False)
  assert env.expert_action() == compare(28)
  assert env.step(compare(30)) == ("equal", True) and env.score() == 1.0
  assert {t["max_turns"] for t in envs.make("number_search", sizes=(8, 16), spare_turns=0).task_pool()} == {4, 5}
  # Held-out tasks: every split gets some.
  assert all(env.tasks(split, 1, seed=0) for split in envs.SPLITS)
  with pytest.raises(ValueError, match="offsets"):
    envs.make("number_search", offsets=(-1,))
  with pytest.raises(ValueError, match="sizes"):
    envs.make("number_search", sizes=(8, 8))


# ------------------------------------------------------------------------------------------------------------------
# code_repair.


def _alarm(signum, frame):
  raise TimeoutError


def _passes_in_process(source, tests):
  """Trusted-template check without subprocesses (fast). A CPU-time timer (SIGVTALRM after 0.1 s of this process's
  user CPU) stops the planted infinite loops; wall time would also fire on a correct solution on a loaded machine."""
  old = signal.signal(signal.SIGVTALRM, _alarm)
  signal.setitimer(signal.ITIMER_VIRTUAL, 0.1)
  try:
    ns = {}
    exec(source, ns)
    return all(eval(expr, ns) == expected for expr, expected in tests)
  except Exception:  # noqa: BLE001 -- a crash of a planted bug is a failing test, which is what we assert
    return False
  finally:
    signal.setitimer(signal.ITIMER_VIRTUAL, 0)
    signal.signal(signal.SIGVTALRM, old)


def test_code_repair_pool_every_bug_fails_and_every_solution_passes():
  pool = code_repair_tasks.task_pool()
  assert len(pool) >= 300
  assert len({t["program"] for t in pool}) == len(pool)
  kinds = {t["bug"] for t in pool}
  assert {"off_by_one", "wrong_operator", "wrong_constant", "swapped_arguments", "missing_edge_case"} <= kinds
  for task in pool:
    program, solution = task["program"].splitlines(), task["solution"].splitlines()
    assert len(program) == len(solution) <= 8
    assert [i for i, (a, b) in enumerate(zip(program, solution), 1) if a != b] == [task["bug_line"]]
    assert _passes_in_process(task["solution"], task["tests"]), task["key"]
    assert not _passes_in_process(task["program"], task["tests"]), task["key"]


@pytest.fixture
def repair_env():
  return envs.make("code_repair", timeout_s=1.0)


def _task(env, key_part):
  return next(t for t in env.task_pool() if key_part in t["key"])


def test_code_repair_rules(repair_env):
  env = repair_env
  task = _task(env, "scaled_sum/c2/b0")  # `range(1, n)`: off by one on line 3
  env.reset(task)
  view, done = env.step(ToolCall("view", {}))
  assert view.splitlines()[2] == "3   for i in range(1, n):" and not done
  assert env.step(ToolCall("run_tests", {})) == ("1/4 passed; fail: f(1) == 2, got 0", False)
  assert env.step(ToolCall("edit", {"line": 9, "text": "x"})) == ("error: line must be in 1..5", False)
  assert env.step(ToolCall("edit", {"line": 3, "text": "  for i in range(1, n + 1):"})) == ("ok", False)
  assert env.step(ToolCall("run_tests", {})) == ("4/4 passed", False)
  assert env.score() == 0.0  # not submitted yet
  assert env.step(ToolCall("submit", {})) == ("4/4 passed", True)
  assert env.score() == 1.0


def test_code_repair_submit_of_buggy_program_scores_zero(repair_env):
  repair_env.reset(_task(repair_env, "fib/c3/b0"))
  observation, done = repair_env.step(ToolCall("submit", {}))
  assert done and "passed; fail:" in observation
  assert repair_env.score() == 0.0


def test_code_repair_hanging_program_times_out_as_observation():
  env = envs.make("code_repair", timeout_s=0.3)
  env.reset(_task(env, "int_log/c2/b0"))  # `n = n // 1`: loops forever
  assert env.step(ToolCall("run_tests", {})) == ("timeout: tests did not finish", False)


def test_code_repair_broken_edit_gives_syntax_error_observation(repair_env):
  repair_env.reset(_task(repair_env, "clamp/c4/b0"))
  repair_env.step(ToolCall("edit", {"line": 1, "text": "def f(x)"}))
  observation, _ = repair_env.step(ToolCall("run_tests", {}))
  assert observation.startswith("error: SyntaxError line 1")


def test_code_repair_expert_success_rates(repair_env):
  tasks = repair_env.tasks("train", 16, seed=0)
  rng = np.random.default_rng(0)
  expert = [repair_env.demonstrate(t, rng) for t in tasks]
  assert all(d.reward == 1.0 for d in expert)
  assert all([c.name for c in d.calls] == ["view", "edit", "run_tests", "submit"] for d in expert)
  assert expert[0].messages[2]["content"] == tool_format.format_tool_call(expert[0].calls[0])
  assert [m["role"] for m in expert[0].messages] == ["system", "user"] + ["assistant", "tool"] * 4
  noisy = np.mean([repair_env.demonstrate(t, rng, noise=0.5).reward for t in tasks])
  assert noisy < 0.9


def test_demonstrate_rejects_bad_noise(repair_env):
  with pytest.raises(ValueError, match="noise"):
    repair_env.demonstrate(repair_env.tasks("train", 1, 0)[0], np.random.default_rng(0), noise=1.5)


# ------------------------------------------------------------------------------------------------------------------
# The sandbox on its own.

TESTS = [("f(1)", 2), ("f(2)", 4)]


@pytest.mark.parametrize("program,summary", [
    ("def f(x):\n  return 2 * x\n", "2/2 passed"),
    ("def f(x):\n  return x + 1\n", "1/2 passed; fail: f(2) == 4, got 3"),
    ("def f(x):\n  return x == 1\n", "0/2 passed; fail: f(1) == 2, got True"),
    ("def f(x):\n  return 1 // 0\n", "0/2 passed; fail: f(1) raised ZeroDivisionError"),
    ("def f(x):\n  return [0] * 10**10\n", "0/2 passed; fail: f(1) raised MemoryError"),
    ("raise ValueError('boom')\n", "error: ValueError while loading: 'boom'"),
    ("import os\ndef f(x):\n  os._exit(3)\n", "error: crashed (exit 3)"),
    ("import os\nos.write(1, b'junk')\n", "error: unreadable test output"),
    ("def f(x):\n  print('noise' * 100)\n  return 2 * x\n", "2/2 passed"),
])
def test_sandbox_outcomes(program, summary):
  assert sandbox.run_tests(program, TESTS, timeout_s=2.0).summary() == summary


def test_sandbox_kills_hanging_child_within_timeout():
  start = time.monotonic()
  report = sandbox.run_tests("def f(x):\n  while True:\n    pass\n", TESTS, timeout_s=0.3)
  assert report.timed_out and not report.all_passed and report.passed == 0
  assert time.monotonic() - start < 30.0  # killed, not waited for (an endless child would hang here); generous for load


def test_sandbox_runs_in_a_scratch_directory():
  program = "import os\nCWD = os.getcwd()\ndef f(x):\n  return 2 * x\n"
  report = sandbox.run_tests(program, [("CWD.startswith('/')", True), ("'sao_sandbox_' in CWD", True)])
  assert report.all_passed, report.summary()


def test_number_search_split_fractions():
  kwargs = dict(n=16, sizes=tuple(range(8, 17)), show_interval=True, spare_turns=0)
  default = envs.make("number_search", **kwargs)
  wide = envs.make("number_search", split_fractions=(0.5, 0.3, 0.2), **kwargs)
  sizes = {s: len(wide.split_pool(s)) for s in envs.SPLITS}
  assert sum(sizes.values()) == 108 and sizes["validation"] > 2 * len(default.split_pool("validation"))
  keys = {s: {t["key"] for t in wide.split_pool(s)} for s in envs.SPLITS}
  assert not (keys["train"] & keys["validation"]) and not (keys["validation"] & keys["test"])
  assert {t["key"] for t in wide.tasks("validation", 64, seed=0)} == keys["validation"]
  assert all(envs.split_of(k, (0.5, 0.3, 0.2)) == "validation" for k in keys["validation"])
  for bad in ((0.5, 0.5), (0.5, 0.6, -0.1), (0.5, 0.3, 0.3)):
    with pytest.raises(ValueError, match="split_fractions"):
      envs.make("number_search", split_fractions=bad, **kwargs)


def test_number_search_split_by_range_holds_out_whole_ranges():
  kwargs = dict(n=16, sizes=tuple(range(8, 17)), offsets=(0, 20), show_interval=True, spare_turns=0,
                split_fractions=(0.5, 0.3, 0.2))
  by_target = envs.make("number_search", **kwargs)
  by_range = envs.make("number_search", split_by="range", **kwargs)
  ranges = {s: {(t["n"], t.get("offset", 0)) for t in by_range.split_pool(s)} for s in envs.SPLITS}
  # Every split has ranges, no range is in two splits, and each range brings all of its targets.
  assert all(ranges.values())
  assert not (ranges["train"] & ranges["validation"]) and not (ranges["train"] & ranges["test"])
  assert not (ranges["validation"] & ranges["test"])
  for split in envs.SPLITS:
    pool = by_range.split_pool(split)
    assert len(pool) == sum(size for size, _ in ranges[split])
    assert all(envs.split_of(number_search.range_key(t["n"], t.get("offset", 0)), (0.5, 0.3, 0.2)) == split
               for t in pool)
  # Same task pool and keys as the default split: only the held-out choice differs.
  assert by_range.task_pool() == by_target.task_pool()
  target_split = {(t["n"], t.get("offset", 0)) for t in by_target.split_pool("validation")}
  assert target_split & ranges["train"]  # holding out targets leaves their ranges in training
  with pytest.raises(ValueError, match="split_by"):
    envs.make("number_search", split_by="size", **kwargs)
