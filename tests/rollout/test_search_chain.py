"""search_chain: its rules (rounds, the shared budget, the slack in every observation), the scripted expert's success
rates, and held-out splits of whole plans."""
import json

import numpy as np
import pytest

from sao.rollout import envs
from sao.rollout.envs import search_chain
from sao.rollout.tool_format import ToolCall


@pytest.fixture(scope="module")
def chain():
  """The toy config's env (its 4,096-task pool is built once and cached by the instance)."""
  return envs.make("search_chain")


def compare(guess):
  return ToolCall("compare", {"guess": guess})


def task(plan, targets, spare=2):
  env = envs.make("search_chain", spare_turns=spare)
  return env, {"env": "search_chain", "key": "k", "task_id": "k", "plan": list(plan), "targets": list(targets),
               "max_turns": env.turn_budget(tuple(plan))}


def test_registered_and_budget_is_binary_search_worst_case_plus_spare():
  env = envs.make("search_chain", sizes=(8, 15), rounds=3, spare_turns=2)
  assert isinstance(env, search_chain.SearchChain) and "search_chain" in envs.registered()
  assert [search_chain.worst_case_turns(n) for n in (0, 1, 2, 3, 7, 8, 15, 16)] == [0, 1, 2, 2, 3, 4, 4, 5]
  assert env.turn_budget((8, 15, 8)) == 4 + 4 + 4 + 2


def test_rounds_chain_and_observations_carry_interval_and_slack():
  env, t = task((8, 12), (3, 12), spare=1)  # budget 4 + 4 + 1 = 9
  messages = env.reset(t)
  assert messages[1]["content"] == "Find the number in 1..8. 2 numbers, 9 turns."
  assert env.slack() == 1
  assert env.step(compare(4)) == ("lower 1..3 +2", False)  # 8 turns left, need 2 + 4: the lucky (smaller) side
  assert env.step(compare(8)) == ("lower 1..3 +1", False)  # a wasted guess costs one slack
  assert env.step(compare(2)) == ("higher 3..3 +1", False)  # a midpoint guess keeps it
  assert env.step(compare(3)) == ("equal 1..12 +1", False)  # round 2 starts: 5 turns left, need 4
  assert env.score() == 0.0  # nothing is paid for a round on its own
  assert env.step(compare(13)) == ("error: guess must be in 1..12 +0", False)
  assert env.step(compare(6)) == ("higher 7..12 +0", False)
  assert env.step(compare(9)) == ("higher 10..12 +0", False)
  assert env.step(compare(11)) == ("higher 12..12 +0", False)
  assert env.step(compare(12)) == ("equal", True)  # on the last turn of the budget
  assert env.score() == 1.0


def test_budget_ends_the_chain_with_reward_zero():
  env, t = task((8, 8), (1, 1), spare=0)
  env.reset(t)
  for turn in range(8):
    observation, done = env.step(compare(8))
    assert done == (turn == 7), (turn, observation)
  assert env.score() == 0.0
  with pytest.raises(RuntimeError, match="after the episode ended"):
    env.step(compare(1))


def test_malformed_call_uses_a_turn():
  env, t = task((8,), (5,), spare=0)
  env.reset(t)
  observation, done = env.step_text("no tool call here")
  assert observation.startswith("error") and not done and env.turns == 1


def test_reset_rejects_inconsistent_tasks():
  env, t = task((8, 9), (3, 10))
  with pytest.raises(ValueError, match="outside 1..9"):
    env.reset(t)
  with pytest.raises(ValueError, match="one length"):
    env.reset(dict(t, targets=[3]))


def test_bad_config_names_the_setting():
  for kwargs, name in ((dict(sizes=(8, 8)), "sizes"), (dict(rounds=0), "rounds"), (dict(spare_turns=-1), "spare_turns"),
                       (dict(targets_per_plan=0), "targets_per_plan"),
                       (dict(split_fractions=(0.5, 0.5, 0.0)), "split_fractions")):
    with pytest.raises(ValueError, match=name):
      envs.make("search_chain", **kwargs)


def test_slack_is_what_binary_search_needs_from_every_state():
  """Slack ≥ 0 ⇒ the expert from here always finishes; on every task of a small configuration, after random
  prefixes of guesses, the expert's continuation succeeds whenever the slack is ≥ 0, and the slack
  is the one the observation shows (it can exceed the spare turns: an answer that leaves the smaller side gains one)."""
  env = envs.make("search_chain", sizes=(3, 5, 8), rounds=2, spare_turns=1, targets_per_plan=3)
  rng = np.random.default_rng(0)
  checked = 0
  for t in env.task_pool():
    for prefix in range(6):
      env.reset(t)
      slack, done = env.slack(), False
      for _ in range(prefix):
        observation, done = env.step(env.noisy_action(rng))
        if done:
          break
        slack = int(observation.rsplit(" ", 1)[1])
        assert slack == env.slack()
      if done:
        continue
      while not done:
        _, done = env.step(env.expert_action())
      if slack >= 0:
        assert env.score() == 1.0, (t, prefix)
      checked += 1
  assert checked > 120


@pytest.mark.parametrize("noise, low, high", [(0.0, 1.0, 1.0), (0.5, 0.45, 0.7), (1.0, 0.0, 0.1)])
def test_expert_success_rates(chain, noise, low, high):
  """The expert solves every task; the toy config's demonstrations (noise 0.5) succeed about half the time; random
  guesses almost never finish four rounds."""
  env = chain
  rng = np.random.default_rng(0)
  rewards = [env.demonstrate(t, rng, noise=noise).reward for t in env.tasks("train", 200, seed=0)]
  assert low <= np.mean(rewards) <= high


def test_splits_hold_out_whole_plans_and_are_deterministic(chain):
  env = chain
  pool = env.task_pool()
  assert len(pool) == 8 ** 4 and len({t["key"] for t in pool}) == len(pool)
  plans = {split: {tuple(t["plan"]) for t in env.split_pool(split)} for split in envs.SPLITS}
  assert not plans["train"] & plans["validation"] and not plans["train"] & plans["test"]
  assert not plans["validation"] & plans["test"]
  assert sum(len(p) for p in plans.values()) == 8 ** 4
  for split, share in zip(envs.SPLITS, search_chain.CHAIN_SPLIT_FRACTIONS):
    assert abs(len(plans[split]) / 8 ** 4 - share) < 0.02
  # Every range size is trained on, at every round, with targets spread over the whole range.
  train = env.split_pool("train")
  for position in range(4):
    assert {t["plan"][position] for t in train} == set(range(8, 16))
    assert {t["targets"][position] for t in train if t["plan"][position] == 15} == set(range(1, 16))
  tasks = env.tasks("validation", 128, seed=3)
  assert json.loads(json.dumps(tasks)) == tasks and tasks == envs.make("search_chain").tasks("validation", 128, seed=3)
  assert all(envs.split_of(search_chain.plan_key(tuple(t["plan"])), env.split_fractions) == "validation"
             for t in tasks)


def test_first_round_sizes_of_their_own():
  """`first_sizes`: every plan opens with one of them, then `rounds` − 1 of `sizes`; the budget counts each round's
  own worst case; bad first sizes are refused naming the setting."""
  env = envs.make("search_chain", sizes=(3, 5), first_sizes=(40, 47), rounds=3, spare_turns=2)
  pool = env.task_pool()
  assert len(pool) == 2 * 2 * 2
  assert {tuple(t["plan"][:1]) for t in pool} == {(40,), (47,)}
  assert all(set(t["plan"][1:]) <= {3, 5} for t in pool)
  assert all(t["max_turns"] == 6 + sum(2 if n == 3 else 3 for n in t["plan"][1:]) + 2 for t in pool)
  env.reset(pool[0])
  assert env.expert_action().arguments["guess"] == (1 + pool[0]["plan"][0]) // 2  # the first range is the first size
  with pytest.raises(ValueError, match="first_sizes"):
    envs.make("search_chain", sizes=(3, 5), first_sizes=(40, 40))


def test_toy_config_is_a_key_to_door_task():
  """`sao_search_chain.py:toy`: one search, then ten trivial rounds that only delay the reward. After the search the
  outcome is decided and every observation says it: with the expert's answer in the trivial rounds, the episode
  succeeds iff the slack shown when the search ends is ≥ 0 — on every training task, after random prefixes — and the
  reward comes ≥ 10 turns after that observation."""
  from experiments.configs import sao_search_chain  # pylint: disable=import-outside-toplevel
  config = sao_search_chain.get_config("toy")
  env = envs.make("search_chain", **config.env.kwargs)
  rng = np.random.default_rng(0)
  outcomes = {True: 0, False: 0}
  for t in env.split_pool("train")[::3]:
    env.reset(t)
    done, observation = False, ""
    while not done and env._round == 0:  # pylint: disable=protected-access
      action = env.noisy_action(rng) if rng.random() < 0.5 else env.expert_action()
      observation, done = env.step(action)
    if done:  # the budget ran out inside the search
      assert env.score() == 0.0
      continue
    slack, turn = int(observation.rsplit(" ", 1)[1]), env.turns
    assert observation.startswith("equal 1..1 ")
    while not done:
      _, done = env.step(env.expert_action())
    assert env.score() == float(slack >= 0), (t["key"], slack)
    if env.score():
      assert env.turns - turn == 10
    outcomes[slack >= 0] += 1
  assert min(outcomes.values()) > 10, outcomes  # both outcomes occur: the search decides
