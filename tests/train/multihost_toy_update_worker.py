"""One process of a learner job on the README toy's real update shape (`tests.multihost.run_processes`): the toy
config's value-pretraining learner (`sao_openswe.py:toy`: 16 length groups, K = 2 critic epochs, whitening) on its
tiny model, `UPDATES` updates of 64 trajectories of 30–130 tokens (the toy's lengths), then the RL learner's
updates with the actor on. Writes `<out>/p<process>.json`: the metrics every process must agree on.

    python -m tests.train.multihost_toy_update_worker --out <dir> [--updates N]
"""
import argparse
import json
import os

from tests.multihost import initialize_from_env

PROCESS = initialize_from_env()

import jax  # noqa: E402  (after the distributed runtime is up)
import numpy as np  # noqa: E402

from experiments.configs import sao_openswe  # noqa: E402
from sao.models import transformer  # noqa: E402
from sao.models.config import ModelConfig  # noqa: E402
from sao.train import phases  # noqa: E402
from sao.train.learner import Learner  # noqa: E402
from sao.transport.trajectory import Trajectory  # noqa: E402

VOCAB = 643


def toy_trajectories(seed: int, n: int = 64) -> list[Trajectory]:
  """`n` multi-turn trajectories of the toy's lengths (30–130 tokens, ≈ 20-token turns, observations between)."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    turns = int(rng.integers(1, 6))
    prompt = int(rng.integers(10, 20))
    length = prompt + 20 * turns
    mask = np.zeros(length, bool)
    for t in range(turns):
      start = prompt + 20 * t
      mask[start:start + 12] = True  # the action; the rest of the turn is the tool's observation
    ids = rng.integers(1, VOCAB, length)
    logprobs = np.where(mask, rng.uniform(-3.0, -0.1, length), 0.0).astype(np.float32)
    out.append(Trajectory(task_id=f"t{seed}-{i}", token_ids=ids, action_mask=mask, rollout_logprobs=logprobs,
                          reward=float(rng.integers(0, 2)), policy_version=0))
  return out


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  parser.add_argument("--updates", type=int, default=3)
  args = parser.parse_args()
  config = sao_openswe.get_config("toy")
  c = config.model.toy
  model_config = ModelConfig.tiny(c.model_type, vocab_size=VOCAB, **{k: v for k, v in c.items() if k != "model_type"})
  params = transformer.init_params(model_config, jax.random.PRNGKey(0))
  record = {}
  for phase, learner_config in (("value_pretrain", phases.value_pretrain_config(config)),
                                ("rl", phases.learner_config(config, **{"sao.critic_warmup_steps": 1}))):
    learner = Learner(learner_config, model_config, params)
    for update in range(args.updates):
      rows = [0, 5] if update == 0 else []  # the trainer's critic traces (`update_traced`) on the first
      metrics, _ = learner.update_traced(toy_trajectories(seed=10 * update + (phase == "rl")), rows)
      record[f"{phase}{update}"] = {k: v for k, v in sorted(metrics.items()) if np.isfinite(v)}
      print(f"[p{PROCESS}] {phase} update {update}: critic loss {metrics['critic/loss']:.5f}", flush=True)
  with open(os.path.join(args.out, f"p{PROCESS}.json"), "w") as f:
    json.dump(record, f)


if __name__ == "__main__":
  main()
