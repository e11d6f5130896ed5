"""Tests for the offline per-split evaluation (`sao.rollout.evaluation`)."""
from __future__ import annotations

import asyncio

import pytest

from sao.engines.sglang_client import GenerateResult
from sao.models.tokenizer import toy_tokenizer
from sao.rollout import envs, evaluation
from sao.rollout.agent import EpisodeLimits

KWARGS = dict(n=16, sizes=tuple(range(8, 17)), show_interval=True, spare_turns=0, split_fractions=(0.5, 0.3, 0.2),
              split_by="range")


class GuessOneEngine:
  """Always guesses 1 and insists on the worker's stop tokens: only the target-1 task of each range succeeds."""

  def __init__(self, tokenizer):
    self.tokenizer, self.calls = tokenizer, 0

  async def generate(self, input_ids, sampling_params):
    assert set(self.tokenizer.eos_token_ids) <= set(sampling_params.stop_token_ids), "worker stop tokens missing"
    self.calls += 1
    text = '<tool_call>{"name": "compare", "arguments": {"guess": 1}}</tool_call>'
    ids = self.tokenizer.encode(text) + [self.tokenizer.eos_token_id]
    return GenerateResult(tuple(ids), tuple([-0.1] * len(ids)), "stop", weight_version="1")


def test_every_task_of_each_split_is_played_samples_times():
  tokenizer = toy_tokenizer()
  engine = GuessOneEngine(tokenizer)
  sampling = evaluation.worker_sampling(tokenizer, max_new_tokens=32, temperature=1.0)
  results = asyncio.run(evaluation.evaluate_splits(
      engine, tokenizer, "number_search", KWARGS, ["validation", "test"], samples=3, sampling=sampling,
      limits=EpisodeLimits(max_turns=16, max_total_tokens=512), concurrency=8))
  env = envs.make("number_search", **KWARGS)
  for split in ("validation", "test"):
    pool = env.split_pool(split)
    ranges = {t["n"] for t in pool}
    res = results[split]
    assert (res.num_tasks, res.episodes, res.by_status) == (len(pool), 3 * len(pool), {"ok": 3 * len(pool)})
    # Guessing 1 finds exactly the target-1 task of each held-out range, every sample.
    assert res.successes == 3 * len(ranges)
    assert res.success_rate == pytest.approx(len(ranges) / len(pool))
    assert res.stderr == pytest.approx((res.success_rate * (1 - res.success_rate) / res.episodes) ** 0.5)
  assert "train" not in results


def test_bad_arguments_are_named():
  tokenizer = toy_tokenizer()
  sampling = evaluation.worker_sampling(tokenizer, 16, 1.0)
  run = lambda **kw: asyncio.run(evaluation.evaluate_splits(
      GuessOneEngine(tokenizer), tokenizer, "number_search", KWARGS, sampling=sampling,
      limits=EpisodeLimits(max_turns=4, max_total_tokens=256), **kw))
  with pytest.raises(ValueError, match="samples"):
    run(splits=["validation"], samples=0)
  with pytest.raises(ValueError, match="dev"):
    run(splits=["dev"], samples=1)
