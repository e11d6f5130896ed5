"""SAO learns a two-armed bandit: after a prompt the policy emits token A or B; A is rewarded."""
import numpy as np

from sao.transport.trajectory import Trajectory
from tests.train import helpers

PROMPT = np.array([5, 9, 13, 17], np.int32)
ARM_A, ARM_B = 40, 41


def _arm_logprobs(learner) -> np.ndarray:
  """log π(A | prompt), log π(B | prompt) under the current policy (full-vocabulary softmax)."""
  ids = np.zeros((8, 16), np.int32)
  mask = np.zeros((8, 16), np.int32)
  for row, arm in enumerate((ARM_A, ARM_B)):
    ids[row, :5] = np.append(PROMPT, arm)
    mask[row, :5] = 1
  logprobs, _ = learner.policy_logprobs({"input_ids": ids, "attention_mask": mask})
  return np.asarray(logprobs)[:2, 4]


def test_sao_raises_logprob_of_rewarded_action():
  learner = helpers.make_learner(**{"sao.critic_warmup_steps": 2})
  rng = np.random.default_rng(0)
  start = _arm_logprobs(learner)
  for _ in range(10):
    lp = _arm_logprobs(learner)
    p_a = np.exp(lp[0]) / np.exp(lp).sum()  # sample from the policy restricted to the two arms
    trajs = []
    for i in range(8):
      pick_a = rng.random() < p_a
      arm, arm_lp = (ARM_A, lp[0]) if pick_a else (ARM_B, lp[1])
      ids = np.append(PROMPT, arm)
      mask = np.array([0, 0, 0, 0, 1], bool)
      trajs.append(Trajectory(task_id=str(i), token_ids=ids, action_mask=mask,
                              rollout_logprobs=np.where(mask, arm_lp, 0.0).astype(np.float32),
                              reward=1.0 if pick_a else 0.0, policy_version=learner.version))
    metrics = learner.update(trajs)
    assert metrics["batch/padded_length"] == 16 and metrics["batch/padded_rows"] == 8
  end = _arm_logprobs(learner)
  assert end[0] > start[0] + 1.0, (start, end)  # the rewarded arm gained log-probability ...
  assert end[0] - end[1] > start[0] - start[1] + 1.0, (start, end)  # ... relative to the other arm
  assert metrics["actor/dis_masked_fraction"] < 0.5
