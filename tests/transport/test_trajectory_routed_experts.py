"""`Trajectory.routed_experts` (MoE routing replay): exact proto and byte round trips, with and without a record,
and clear errors for what cannot be a record."""
from __future__ import annotations

import numpy as np
import pytest

from sao.transport import sao_pb2
from sao.transport.trajectory import ReasonCode, Trajectory, TrajectoryError


def _traj(**kwargs) -> Trajectory:
  base = dict(task_id="t", token_ids=np.arange(6), action_mask=[0, 0, 1, 1, 0, 1],
              rollout_logprobs=[0, 0, -0.5, -1.0, 0, -0.25], reward=1.0)
  return Trajectory(**{**base, **kwargs})


def test_round_trip_with_and_without_a_record():
  routed = np.arange(5 * 4, dtype=np.int64).reshape(5, 4) - 1  # −1 and ids, int64 in: int32 kept
  traj = _traj(routed_experts=routed)
  assert traj.routed_experts.dtype == np.int32
  traj.validate(vocab_size=16)
  msg = traj.to_proto()
  assert msg.routed_experts_columns == 4 and msg.routed_experts == routed.astype("<i4").tobytes()
  back = Trajectory.from_bytes(traj.to_bytes())
  assert back == traj
  np.testing.assert_array_equal(back.routed_experts, routed)
  plain = _traj()
  assert not plain.to_proto().routed_experts and Trajectory.from_proto(plain.to_proto()).routed_experts is None
  assert Trajectory.from_proto(plain.to_proto()) == plain and plain != traj
  empty = _traj(routed_experts=np.zeros((0, 4), np.int32))
  assert Trajectory.from_bytes(empty.to_bytes()) == empty


def test_bad_records_are_refused():
  with pytest.raises(TrajectoryError, match=r"routed_experts.*expected int \[tokens, layers·top_k\]"):
    _traj(routed_experts=np.zeros((5, 2, 2), np.int32))
  with pytest.raises(TrajectoryError, match=r"routed_experts.*outside \[-1, int32\]"):
    _traj(routed_experts=np.full((5, 4), -2))
  with pytest.raises(TrajectoryError, match="7 rows for 6 tokens") as raised:
    _traj(routed_experts=np.zeros((7, 4), np.int32)).validate(vocab_size=16)
  assert raised.value.reason_code == ReasonCode.LENGTH_MISMATCH
  msg = _traj().to_proto()
  msg.routed_experts, msg.routed_experts_columns = b"\x00" * 6, 1
  with pytest.raises(TrajectoryError, match="6 bytes do not split into rows of 1 int32 ids"):
    Trajectory.from_proto(msg)
  assert sao_pb2.Trajectory().routed_experts_columns == 0
