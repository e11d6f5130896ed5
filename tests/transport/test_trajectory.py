"""Tests for the trajectory record: every validation failure mode, the proto round trip, the generated code."""
import dataclasses
import math
import re
import pathlib

import hypothesis
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
import numpy as np
import pytest
from google.protobuf import runtime_version

from sao.transport import sao_pb2
from sao.transport import sao_pb2_grpc
from sao.transport import trajectory as traj_lib
from sao.transport.trajectory import ReasonCode, Status, Trajectory, TrajectoryError

VOCAB = 100


def make(**overrides) -> Trajectory:
  """A valid 8-token trajectory: prompt (3), action (2), observation (2), action (1)."""
  kwargs = dict(
      task_id="t0",
      token_ids=[1, 2, 3, 10, 11, 4, 5, 12],
      action_mask=[0, 0, 0, 1, 1, 0, 0, 1],
      rollout_logprobs=[0, 0, 0, -0.5, -1.0, 0, 0, -0.1],
      reward=1.0,
      policy_version=3,
      turn_boundaries=(0, 3, 5, 7),
      num_turns=2,
      status="ok",
      harness="sao",
      timings={"total": 1.5},
      metrics={"turns": 2.0},
      lease_id="lease-1",
      metadata={"env": "number_search"},
  )
  kwargs.update(overrides)
  return Trajectory(**kwargs)


def test_valid_trajectory_passes_and_derived_fields():
  t = make()
  t.validate(VOCAB)
  assert t.token_ids.dtype == np.int32 and t.action_mask.dtype == bool and t.rollout_logprobs.dtype == np.float32
  assert t.num_tokens == 8 and t.num_action_tokens == 3
  assert t.reward_token_index() == 7
  assert t.status is Status.OK and t.is_trainable
  assert not make(status="timeout").is_trainable and make(status="truncated").is_trainable
  assert t.staleness(5) == 2


def test_reward_token_index_is_last_action_token_even_when_ending_on_observation():
  t = make(action_mask=[0, 0, 0, 1, 1, 0, 0, 0], rollout_logprobs=[0, 0, 0, -0.5, -1.0, 0, 0, 0])
  assert t.reward_token_index() == 4


# (overrides, field, reason code): one entry per failure mode of validate().
FAILURES = [
    (dict(token_ids=[], action_mask=[], rollout_logprobs=[], turn_boundaries=()), "token_ids", ReasonCode.EMPTY),
    (dict(action_mask=[0, 0, 0, 1, 1, 0, 0]), "action_mask", ReasonCode.LENGTH_MISMATCH),
    (dict(rollout_logprobs=[0, 0, 0, -0.5, -1.0, 0, 0, -0.1, 0]), "rollout_logprobs", ReasonCode.LENGTH_MISMATCH),
    (dict(rollout_logprobs=[0, 0, 0, np.nan, -1.0, 0, 0, -0.1]), "rollout_logprobs", ReasonCode.NON_FINITE),
    (dict(rollout_logprobs=[0, 0, 0, -np.inf, -1.0, 0, 0, -0.1]), "rollout_logprobs", ReasonCode.NON_FINITE),
    (dict(rollout_logprobs=[0, 0, 0, 0.5, -1.0, 0, 0, -0.1]), "rollout_logprobs", ReasonCode.POSITIVE_LOGPROB),
    (dict(rollout_logprobs=[0, -0.2, 0, -0.5, -1.0, 0, 0, -0.1]), "rollout_logprobs",
     ReasonCode.OBSERVATION_LOGPROB),
    (dict(reward=math.nan), "reward", ReasonCode.NON_FINITE),
    (dict(reward=math.inf), "reward", ReasonCode.NON_FINITE),
    (dict(token_ids=[1, 2, 3, 10, 100, 4, 5, 12]), "token_ids", ReasonCode.TOKEN_OUT_OF_RANGE),
    (dict(token_ids=[1, 2, -1, 10, 11, 4, 5, 12]), "token_ids", ReasonCode.TOKEN_OUT_OF_RANGE),
    (dict(action_mask=[0] * 8, rollout_logprobs=[0.0] * 8), "action_mask", ReasonCode.NO_ACTION_TOKEN),
    (dict(status="exploded"), "status", ReasonCode.UNKNOWN_STATUS),
    (dict(turn_boundaries=(0, 5, 3)), "turn_boundaries", ReasonCode.BAD_TURN_BOUNDARIES),
    (dict(turn_boundaries=(0, 3, 3)), "turn_boundaries", ReasonCode.BAD_TURN_BOUNDARIES),
    (dict(turn_boundaries=(0, 3, 8)), "turn_boundaries", ReasonCode.BAD_TURN_BOUNDARIES),
    (dict(turn_boundaries=(-1, 3)), "turn_boundaries", ReasonCode.BAD_TURN_BOUNDARIES),
    (dict(policy_version=-1), "policy_version", ReasonCode.NEGATIVE_POLICY_VERSION),
    (dict(task_id=""), "task_id", ReasonCode.INVALID_FIELD),
    (dict(sample_index=-2), "sample_index", ReasonCode.INVALID_FIELD),
    (dict(num_turns=-1), "num_turns", ReasonCode.INVALID_FIELD),
    (dict(timings={"total": math.nan}), "timings['total']", ReasonCode.NON_FINITE),
    (dict(metrics={"x": -math.inf}), "metrics['x']", ReasonCode.NON_FINITE),
]


@pytest.mark.parametrize("overrides,field,code", FAILURES, ids=[f"{f}-{c.name}" for _, f, c in FAILURES])
def test_validate_names_field_and_reason(overrides, field, code):
  t = make(**overrides)
  with pytest.raises(TrajectoryError) as info:
    t.validate(VOCAB)
  assert info.value.field == field
  assert info.value.reason_code is code
  assert field in str(info.value) and code.name in str(info.value)
  assert isinstance(info.value, ValueError)


# Failures the constructor catches: a lossy conversion would hide the problem from validate().
CONSTRUCTION_FAILURES = [
    (dict(token_ids=[1, 2, 3, 2**40, 11, 4, 5, 12]), "token_ids", ReasonCode.TOKEN_OUT_OF_RANGE),
    (dict(token_ids=[1.5] * 8), "token_ids", ReasonCode.INVALID_FIELD),
    (dict(token_ids=[[1, 2]] * 4), "token_ids", ReasonCode.INVALID_FIELD),
    (dict(action_mask=[0, 0, 0, 2, 1, 0, 0, 1]), "action_mask", ReasonCode.INVALID_FIELD),
    (dict(rollout_logprobs=["a"] * 8), "rollout_logprobs", ReasonCode.INVALID_FIELD),
    (dict(turn_boundaries=(0, 2**33)), "turn_boundaries", ReasonCode.BAD_TURN_BOUNDARIES),
]


@pytest.mark.parametrize("overrides,field,code", CONSTRUCTION_FAILURES,
                         ids=[f"{f}-{c.name}" for _, f, c in CONSTRUCTION_FAILURES])
def test_constructor_rejects_lossy_inputs(overrides, field, code):
  with pytest.raises(TrajectoryError) as info:
    make(**overrides)
  assert (info.value.field, info.value.reason_code) == (field, code)


def test_float64_logprob_beyond_float32_becomes_non_finite():
  t = make(rollout_logprobs=[0, 0, 0, -1e300, -1.0, 0, 0, -0.1])
  with pytest.raises(TrajectoryError, match="rollout_logprobs") as info:
    t.validate(VOCAB)
  assert info.value.reason_code is ReasonCode.NON_FINITE


def test_reward_token_index_without_action_raises():
  with pytest.raises(TrajectoryError) as info:
    make(action_mask=[0] * 8, rollout_logprobs=[0.0] * 8).reward_token_index()
  assert info.value.field == "action_mask" and info.value.reason_code is ReasonCode.NO_ACTION_TOKEN


def test_reason_codes_match_proto_enum():
  proto = {name.removeprefix("REJECT_REASON_"): num for name, num in sao_pb2.RejectReason.items()}
  assert proto == {c.name: c.value for c in ReasonCode}


def test_status_enum_matches_proto():
  proto = {name.removeprefix("TRAJECTORY_STATUS_").lower() for name in sao_pb2.TrajectoryStatus.keys()}
  assert proto - {"unspecified"} == {s.value for s in Status}


def test_from_proto_rejects_unspecified_status_and_bad_mask_byte():
  msg = make().to_proto()
  msg.status = sao_pb2.TRAJECTORY_STATUS_UNSPECIFIED
  with pytest.raises(TrajectoryError) as info:
    Trajectory.from_proto(msg)
  assert (info.value.field, info.value.reason_code) == ("status", ReasonCode.UNKNOWN_STATUS)
  msg = make().to_proto()
  msg.action_mask = bytes([0, 0, 0, 1, 7, 0, 0, 1])
  with pytest.raises(TrajectoryError) as info:
    Trajectory.from_proto(msg)
  assert info.value.field == "action_mask"


def test_to_proto_rejects_unknown_status():
  with pytest.raises(TrajectoryError) as info:
    make(status="weird").to_proto()
  assert info.value.reason_code is ReasonCode.UNKNOWN_STATUS


def test_reject_result_carries_code_field_and_message():
  try:
    make(policy_version=-4).validate(VOCAB)
  except TrajectoryError as e:
    result = traj_lib.reject_result(e, retry_after_ms=0)
  assert not result.accepted
  assert result.reason == sao_pb2.REJECT_REASON_NEGATIVE_POLICY_VERSION
  assert result.field == "policy_version" and "policy_version" in result.message


def test_wire_is_packed_and_compact():
  t = make(token_ids=np.arange(1000) % VOCAB, action_mask=np.ones(1000, bool),
           rollout_logprobs=np.full(1000, -0.25, np.float32), turn_boundaries=())
  # Packed int32 ids < 128 take one byte each, the mask one byte each, the log-probs four bytes each.
  assert len(t.to_bytes()) < 1000 * (2 + 1 + 4) + 200


_names = st.text(max_size=8)
_floats64 = st.floats(allow_nan=False, allow_infinity=False)


@st.composite
def trajectories(draw):
  t = draw(st.integers(0, 40))
  token_ids = draw(hnp.arrays(np.int32, t, elements=st.integers(-(2**31), 2**31 - 1)))
  mask = draw(hnp.arrays(bool, t))
  logprobs = draw(hnp.arrays(np.float32, t, elements=st.floats(width=32, allow_nan=False, allow_infinity=False)))
  boundaries = draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=6))
  return Trajectory(
      task_id=draw(_names), token_ids=token_ids, action_mask=mask, rollout_logprobs=logprobs,
      reward=draw(_floats64), policy_version=draw(st.integers(-(2**63), 2**63 - 1)),
      sample_index=draw(st.integers(-(2**31), 2**31 - 1)), group_id=draw(_names),
      turn_boundaries=tuple(boundaries), num_turns=draw(st.integers(-(2**31), 2**31 - 1)),
      status=draw(st.sampled_from(list(Status))), harness=draw(_names),
      timings=draw(st.dictionaries(_names, _floats64, max_size=3)),
      metrics=draw(st.dictionaries(_names, _floats64, max_size=3)), lease_id=draw(_names),
      metadata=draw(st.dictionaries(_names, _names, max_size=3)))


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(trajectories())
def test_proto_round_trip_is_exact(t):
  # Exact even for trajectories validate() would reject: the wire never hides a problem from the trainer.
  assert Trajectory.from_proto(t.to_proto()) == t
  assert Trajectory.from_bytes(t.to_bytes()) == t


def test_equality_is_bitwise():
  a = make()
  b = dataclasses.replace(a, rollout_logprobs=a.rollout_logprobs.copy())
  assert a == b
  b.rollout_logprobs[3] = np.nextafter(np.float32(-0.5), np.float32(0))
  assert a != b


def test_generated_code_runtime_requirement():
  """The gencode pins a minimum protobuf runtime; the installed one must satisfy it (see gen_proto.sh)."""
  src = pathlib.Path(sao_pb2.__file__).read_text()
  major, minor, patch = map(int, re.search(r"# Protobuf Python Version: (\d+)\.(\d+)\.(\d+)", src).groups())
  assert (runtime_version.MAJOR, runtime_version.MINOR, runtime_version.PATCH) >= (major, minor, patch)
  assert runtime_version.MAJOR == major  # protobuf supports gencode only within one major version
  grpc_src = pathlib.Path(sao_pb2_grpc.__file__).read_text()
  assert "from sao.transport import sao_pb2 as" in grpc_src
  assert hasattr(sao_pb2_grpc, "TrajectoryServiceStub") and hasattr(sao_pb2_grpc, "TrajectoryServiceServicer")


def test_service_has_the_four_rpcs():
  service = sao_pb2.DESCRIPTOR.services_by_name["TrajectoryService"]
  assert {m.name for m in service.methods} == {"LeaseTasks", "SubmitTrajectories", "Heartbeat", "GetStatus"}
  assert sao_pb2.DESCRIPTOR.package == "sao.transport.v1"
