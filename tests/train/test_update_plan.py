"""`Learner.update_plan`: what two processes compare before an update (`sao.train.coordination.agree`) — equal for
equal learners and batches, different when a batch, a clock or a branch differs — and the recorded program
sequence of each update (`sao.train.mesh_jit.ProgramLog`), which the next plan carries."""
import numpy as np

from sao.train import batching
from tests.train import helpers


def _learner(**overrides):
  return helpers.make_learner(**{"batching.length_groups": 2, "sao.critic_warmup_steps": 1, **overrides})


def test_equal_learners_plan_equal_updates_and_a_changed_batch_changes_the_plan():
  a, b = _learner(), _learner()
  seen = []
  a.agree = lambda tag, plan: seen.append((tag, plan))
  b.agree = lambda tag, plan: None  # a learner with an agreement records its programs (one process: none)
  batch, _ = a.make_batch(helpers.trajectories(seed=1, n=8))
  b_plan = b.update_plan(batch, _groups(b, batch), np.zeros(0, np.int64))
  a.update(batch)
  b.update(batch)
  (tag, plan), = seen
  assert tag == "update" and plan == b_plan and plan["previous_update_programs"] is None
  assert plan["groups"] == [[len(g.rows), g.length] for g in _groups(a, batch)]
  assert plan["actor_step"] is False and plan["critic_epochs"] == a.config.sao.critic_epochs
  # The next plan carries the update's recorded programs: the same on both learners.
  nxt = a.update_plan(batch, _groups(a, batch), np.zeros(0, np.int64))
  assert nxt["previous_update_programs"] == b.update_plan(batch, _groups(b, batch),
                                                          np.zeros(0, np.int64))["previous_update_programs"]
  programs = nxt["previous_update_programs"]
  assert programs["programs"] > 0 and programs["names"]["value_accumulate"] == 2 * a.config.sao.critic_epochs
  assert nxt["actor_step"] is True and nxt["update"] == 1
  other, _ = a.make_batch(helpers.trajectories(seed=2, n=8))
  assert a.update_plan(other, _groups(a, other), np.zeros(0, np.int64))["batch_digest"] != nxt["batch_digest"]


def test_batch_digest_sees_every_field():
  learner = _learner()
  batch, _ = learner.make_batch(helpers.trajectories(seed=3, n=8))
  before = batching.digest(batch)
  for key in ("rewards", "rollout_logprobs", "action_mask"):
    changed = dict(batch, **{key: np.array(batch[key], copy=True)})
    changed[key].flat[1] = not changed[key].flat[1] if changed[key].dtype == bool else changed[key].flat[1] + 1
    assert batching.digest(changed) != before, key
  assert batching.digest(dict(batch)) == before


def _groups(learner, batch):
  return batching.length_groups(batch["attention_mask"], learner.config.batching.length_groups,
                                learner.batcher.batch_multiple, learner.batcher.bucket_lengths)


def test_a_learner_without_agreement_records_no_programs():
  learner = _learner()
  learner.update(helpers.trajectories(seed=4, n=8))
  assert learner.agree is None and learner._last_programs is None  # pylint: disable=protected-access
