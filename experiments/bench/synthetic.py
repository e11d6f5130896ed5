"""The learner benchmarks' synthetic batch (`bench_train.py`, `profile_train.py`, `bench_accelerator.py`)."""
from __future__ import annotations

import os
import sys

import numpy as np

# the repository, two folders up: this checkout's `sao`
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from sao.transport.trajectory import Trajectory  # noqa: E402


def synthetic_trajectories(rng: np.random.Generator, batch: int, seq_len: int, vocab: int) -> list[Trajectory]:
  """`batch` trajectories of `seq_len` tokens: a prompt (the first T/8), then action tokens with one tool observation
  of T/8 tokens at T/2; random tokens, rollout log-probs of −2, rewards 0 or 1."""
  out = []
  for i in range(batch):
    mask = np.zeros(seq_len, bool)
    mask[seq_len // 8:] = True
    mask[seq_len // 2: seq_len // 2 + seq_len // 8] = False  # a tool observation
    out.append(Trajectory(task_id=str(i), token_ids=rng.integers(0, vocab, seq_len), action_mask=mask,
                          rollout_logprobs=np.where(mask, -2.0, 0.0).astype(np.float32),
                          reward=float(rng.integers(0, 2))))
  return out
