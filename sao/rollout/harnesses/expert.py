"""The scripted expert as an engine: demonstrations played through any harness, in that harness's own format.

`ExpertEngine.generate` ignores the prompt: it asks the episode's environment for the expert's next call (or, with
probability `noise` per turn, a noisy one, drawing from `rng` exactly as `Env.demonstrate` does), writes it with the
harness's `format_call`, and returns its tokens plus the stop token with log-prob 0. Running a harness episode with
it gives the token stream the harness builds for those actions — for scaffolds, through the proxy — so the
supervised warm start teaches every harness's conventions, and demonstrations equal agent-loop replays by
construction.
"""
from __future__ import annotations

import asyncio
from typing import Any, Sequence

import numpy as np

from sao.engines.sglang_client import GenerateResult
from sao.models.sampling import SamplingParams
from sao.models.tokenizer import Tokenizer
from sao.rollout import agent
from sao.rollout.envs.base import Env
from sao.rollout.harnesses.base import Harness
from sao.rollout.harnesses.registry import get
from sao.transport.trajectory import Trajectory

# Generous: the environment's own turn budget ends a demonstration, never these.
DEMO_LIMITS = agent.EpisodeLimits(max_turns=1000, max_total_tokens=1 << 20, timeout_s=600.0)


class ExpertEngine:
  """An `agent.Engine` that plays `env`'s scripted expert in `harness`'s format (see the module docstring)."""

  def __init__(self, env: Env, harness: Harness, tokenizer: Tokenizer, rng: np.random.Generator | None = None,
               noise: float = 0.0):
    if not 0.0 <= noise <= 1.0:
      raise ValueError(f"noise: must be in [0, 1], got {noise}")
    if noise and rng is None:
      raise ValueError("noise > 0 needs an rng")
    self.env, self.harness, self.tokenizer, self.rng, self.noise = env, harness, tokenizer, rng, noise
    self.calls = []
    self.num_expert_calls = 0

  async def generate(self, input_ids: Sequence[int], sampling_params: SamplingParams) -> GenerateResult:
    del sampling_params
    noisy = bool(self.noise) and self.rng.random() < self.noise
    if noisy:
      call = self.env.noisy_action(self.rng)
    else:
      call = self.harness.expert_call(self.env, self.num_expert_calls)
      self.num_expert_calls += 1
    self.calls.append(call)
    ids = self.tokenizer.encode(self.harness.format_call(call, self.env)) + [self.tokenizer.eos_token_ids[0]]
    return GenerateResult(token_ids=tuple(ids), logprobs=tuple(0.0 for _ in ids), finish_reason="stop",
                          weight_version="0", prompt_tokens=len(input_ids))


async def demonstrate(harness: Harness, env: Env, task: dict[str, Any], tokenizer: Tokenizer,
                      rng: np.random.Generator | None = None, noise: float = 0.0) -> Trajectory:
  """One expert episode of `task` through `harness` (resets `env`). Raises if the episode did not end normally."""
  engine = ExpertEngine(env, harness, tokenizer, rng, noise)
  sampling = SamplingParams(max_new_tokens=1 << 16, stop_token_ids=tuple(tokenizer.eos_token_ids))
  traj = await harness.run_episode(engine, tokenizer, env, task, sampling, DEMO_LIMITS)
  if traj.status != "ok":
    raise RuntimeError(f"demonstration of task {task.get('task_id')!r} through {harness.name!r} ended with "
                       f"{traj.status}: {traj.metadata.get('error', '')}")
  return traj


def demonstrate_all(harness_names: Sequence[str], env: Env, tasks: Sequence[dict[str, Any]], tokenizer: Tokenizer,
                    rng: np.random.Generator, noise: float = 0.0) -> list[Trajectory]:
  """`demonstrate` for each task in turn, task i through `harness_names[i]` (one environment, sequentially)."""
  if len(harness_names) != len(tasks):
    raise ValueError(f"harness_names: {len(harness_names)} names for {len(tasks)} tasks")

  async def run():
    return [await demonstrate(get(name), env, task, tokenizer, rng, noise)
            for name, task in zip(harness_names, tasks)]

  try:
    return asyncio.run(run())
  finally:
    if hasattr(env, "close"):  # sandboxed environments free the last episode's directory
      env.close()
