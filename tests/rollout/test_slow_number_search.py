"""slow_number_search: number_search's rules plus a heavy-tailed per-episode delay carried by the task."""
import time

import numpy as np
import pytest

from sao.rollout import envs
from sao.rollout.envs.slow_number_search import pareto_delay


def test_registered_and_tasks_carry_the_delay():
  env = envs.make("slow_number_search", n=16, delay_pareto_alpha=1.3, delay_scale_s=0.01, delay_max_s=0.05)
  tasks = env.tasks("train", 5, seed=0)
  assert all(t["env"] == "slow_number_search" and t["delay_pareto_alpha"] == 1.3 for t in tasks)
  # Same keys (so the same split) as plain number_search.
  plain = envs.make("number_search", n=16).tasks("train", 5, seed=0)
  assert [t["key"] for t in tasks] == [t["key"] for t in plain]


def test_episode_sleeps_within_bounds_and_keeps_the_rules():
  env = envs.make("slow_number_search", n=16, delay_scale_s=0.02, delay_max_s=0.05, seed=1)
  task = env.tasks("train", 1, seed=0)[0]
  start = time.monotonic()
  env.reset(task)
  assert 0.02 <= env.last_delay_s <= 0.05
  assert time.monotonic() - start >= env.last_delay_s * 0.9
  done = False
  for _ in range(task["max_turns"]):
    _, done = env.step(env.expert_action())
    if done:
      break
  assert done and env.score() == 1.0


def test_demonstrations_do_not_sleep():
  env = envs.make("slow_number_search", n=16, delay_scale_s=5.0, delay_max_s=5.0)
  start = time.monotonic()
  demo = env.demonstrate(env.tasks("train", 1, seed=0)[0], np.random.default_rng(0))
  assert time.monotonic() - start < 4.5 and demo.reward == 1.0  # one sleep would be 5 s


def test_pareto_delay_is_heavy_tailed():
  rng = np.random.default_rng(0)
  draws = np.array([pareto_delay(rng, 1.2, 1.0, 1e9) for _ in range(20000)])
  assert draws.min() >= 1.0
  assert np.median(draws) == pytest.approx(2 ** (1 / 1.2), rel=0.05)  # Pareto median: scale * 2^(1/alpha)
  assert np.quantile(draws, 0.99) > 20 * np.median(draws) / 4  # a long tail


def test_bad_config_is_an_error():
  with pytest.raises(ValueError, match="delay_pareto_alpha"):
    envs.make("slow_number_search", delay_pareto_alpha=0.0)
