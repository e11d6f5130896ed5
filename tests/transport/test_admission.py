"""What the trainer refuses at submission: values its learner cannot take (issue: reward 1e39, log-prob -3e38,
version 2^31 / 1e9, an 8M-token trajectory were accepted), submissions under another worker's lease, and invalid
re-sends of accepted keys (they used to be acknowledged as DUPLICATE before validation)."""
import numpy as np
import pytest

from sao.transport import sao_pb2
from sao.transport.admission import ContentLimits
from sao.transport.trajectory import ReasonCode, Trajectory, TrajectoryError

from tests.transport.helpers import VOCAB, make_traj, running, stub_for, submit_raw


def _lease(stub, worker="w", n=1):
  return stub.LeaseTasks(sao_pb2.LeaseRequest(worker_id=worker, max_tasks=n), timeout=10).tasks


def test_content_limits_reject_what_the_learner_cannot_take():
  limits = ContentLimits(vocab_size=VOCAB, max_tokens=8, max_abs_reward=1e4, min_logprob=-80.0)
  base = dict(task_id="t", token_ids=[1, 2, 3], action_mask=[0, 1, 1], rollout_logprobs=[0.0, -0.5, -79.0],
              reward=1e4, policy_version=3)
  limits.check(Trajectory(**base), max_policy_version=3)  # every bound is inclusive
  cases = [
      (dict(reward=1e39), "reward", ReasonCode.OUT_OF_RANGE, 3),
      (dict(reward=-1.5e4), "reward", ReasonCode.OUT_OF_RANGE, 3),
      (dict(rollout_logprobs=[0.0, -3e38, -0.1]), "rollout_logprobs", ReasonCode.OUT_OF_RANGE, 3),
      (dict(rollout_logprobs=[0.0, -0.1, -80.5]), "rollout_logprobs", ReasonCode.OUT_OF_RANGE, 3),
      (dict(policy_version=2**31), "policy_version", ReasonCode.FUTURE_POLICY, 3),
      (dict(policy_version=10**9), "policy_version", ReasonCode.FUTURE_POLICY, 3),
      (dict(policy_version=4), "policy_version", ReasonCode.FUTURE_POLICY, 3),
      (dict(token_ids=[1] * 9, action_mask=[1] * 9, rollout_logprobs=[-0.1] * 9), "token_ids",
       ReasonCode.TOO_LONG, 3),
  ]
  for overrides, field, code, max_version in cases:
    with pytest.raises(TrajectoryError) as e:
      limits.check(Trajectory(**{**base, **overrides}), max_policy_version=max_version)
    assert (e.value.field, e.value.reason_code) == (field, code), overrides
  limits.check(Trajectory(**{**base, "policy_version": 10**9}), max_policy_version=None)  # log records: no bound


def test_length_is_checked_before_the_per_token_validation():
  # An 8M-token trajectory is refused on its length alone (no O(T) pass over garbage).
  n = 8_000_000
  huge = Trajectory(task_id="t", token_ids=np.ones(n, np.int32), action_mask=np.ones(n, bool),
                    rollout_logprobs=np.full(n, np.nan, np.float32), reward=0.0)
  with pytest.raises(TrajectoryError) as e:
    ContentLimits(vocab_size=VOCAB, max_tokens=512).check(huge)
  assert e.value.reason_code == ReasonCode.TOO_LONG


@pytest.mark.parametrize("bad", [dict(max_abs_reward=float("inf")), dict(min_logprob=0.0),
                                 dict(min_logprob=float("-inf")), dict(max_tokens=0)])
def test_content_limits_refuse_unbounded_ranges(bad):
  with pytest.raises(ValueError):
    ContentLimits(**{"vocab_size": VOCAB, "max_tokens": 8, **bad})


def test_server_rejects_out_of_range_values_with_their_reason(tmp_path):
  with running(tmp_path, max_tokens=6, max_abs_reward=100.0, min_logprob=-50.0) as server:
    server.set_policy_version(2)
    channel, stub = stub_for(server)
    tasks = _lease(stub, n=8)
    cases = [
        (make_traj(tasks[0], version=2**31), ReasonCode.FUTURE_POLICY),
        (make_traj(tasks[1], version=10**9), ReasonCode.FUTURE_POLICY),
        (make_traj(tasks[2], version=2, reward=1e39), ReasonCode.OUT_OF_RANGE),
        (make_traj(tasks[3], version=2, rollout_logprobs=[0, 0, -3e38, -1.0, 0, -0.2]), ReasonCode.OUT_OF_RANGE),
        (make_traj(tasks[4], version=2, token_ids=[1] * 7, action_mask=[1] * 7, rollout_logprobs=[-0.1] * 7,
                   turn_boundaries=()), ReasonCode.TOO_LONG),
    ]
    results = submit_raw(stub, [t.to_proto() for t, _ in cases])
    for (_, code), result in zip(cases, results):
      assert not result.accepted and result.reason == code and result.field, (code, result)
    assert server.stats()["accepted"] == 0
    # The versions a trainer announces before its engines load them are accepted; the next one is not.
    assert submit_raw(stub, [make_traj(tasks[5], version=3).to_proto()])[0].reason == ReasonCode.FUTURE_POLICY
    server.announce_policy_version(3)
    assert submit_raw(stub, [make_traj(tasks[5], version=3).to_proto()])[0].accepted
    assert server.stats()["rejected_by_reason"] == {"FUTURE_POLICY": 3, "OUT_OF_RANGE": 2, "TOO_LONG": 1}
    channel.close()


def test_submission_under_another_workers_lease_is_rejected(tmp_path):
  with running(tmp_path) as server:
    channel, stub = stub_for(server)
    (task,) = _lease(stub, worker="owner")
    intruder = sao_pb2.SubmitRequest(worker_id="intruder", trajectories=[make_traj(task).to_proto()])
    (result,) = stub.SubmitTrajectories(intruder, timeout=10).results
    assert not result.accepted and result.reason == ReasonCode.WRONG_WORKER and result.field == "worker_id"
    hb = stub.Heartbeat(sao_pb2.HeartbeatRequest(worker_id="intruder", lease_ids=[task.lease_id]), timeout=10)
    assert list(hb.extended_lease_ids) == [] and list(hb.expired_lease_ids) == [task.lease_id]
    owner = sao_pb2.SubmitRequest(worker_id="owner", trajectories=[make_traj(task).to_proto()])
    assert stub.SubmitTrajectories(owner, timeout=10).results[0].accepted
    channel.close()


def test_invalid_resend_of_an_accepted_key_is_rejected_not_acknowledged(tmp_path):
  with running(tmp_path) as server:
    channel, stub = stub_for(server)
    (task,) = _lease(stub)
    assert submit_raw(stub, [make_traj(task).to_proto()])[0].accepted
    bad = make_traj(task).to_proto()
    bad.rollout_logprobs[2] = float("nan")
    (result,) = submit_raw(stub, [bad])
    assert not result.accepted and result.reason == ReasonCode.NON_FINITE
    (valid,) = submit_raw(stub, [make_traj(task).to_proto()])  # a valid re-send stays an idempotent DUPLICATE
    assert valid.accepted and valid.reason == ReasonCode.DUPLICATE
    assert (server.stats()["accepted"], server.stats()["duplicates"]) == (1, 1)
    channel.close()
