"""The trajectory record: one finished episode, as the rollout worker hands it to the trainer.

This is the contract between the two halves of the system (DESIGN.md). A `Trajectory` always holds arrays of the
contract dtypes (the constructor converts losslessly or raises); `validate(vocab_size)` checks the semantics the
learner relies on and raises a `TrajectoryError` whose `reason_code` doubles as the gRPC reject reason.

Shapes (T tokens, prompt + model turns + tool observations, unpadded):
  token_ids:        [T] int32
  action_mask:      [T] bool     True on tokens the policy sampled (trained on), False on prompt/observations
  rollout_logprobs: [T] float32  the engine's log-prob of each sampled token; exactly 0 where action_mask is False
  routed_experts:   [R, C] int32 or None  MoE routing replay: the experts the engine routed tokens 0..R−1 to, each
                    row its C = layers·top_k ids (SGLang's `routed_experts` rows, `sao.models.routed_experts`; −1 where
                    none), R <= T (the last model turn's record covers the stream before its last token)
"""
from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any, Mapping

import numpy as np

from sao.transport import sao_pb2

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


class Status(enum.StrEnum):
  """How an episode ended. Only `ok` and `truncated` episodes are trained on (docs/algorithm.md)."""
  OK = "ok"
  TIMEOUT = "timeout"
  ENV_ERROR = "env_error"
  TRUNCATED = "truncated"


class ReasonCode(enum.IntEnum):
  """Why a trajectory is rejected; numbers equal the proto's `RejectReason` (`REJECT_REASON_<name>`)."""
  NONE = 0
  INVALID_FIELD = 1
  EMPTY = 2
  LENGTH_MISMATCH = 3
  NON_FINITE = 4
  POSITIVE_LOGPROB = 5
  TOKEN_OUT_OF_RANGE = 6
  NO_ACTION_TOKEN = 7
  OBSERVATION_LOGPROB = 8
  UNKNOWN_STATUS = 9
  BAD_TURN_BOUNDARIES = 10
  NEGATIVE_POLICY_VERSION = 11
  # Raised by the trainer-side content limits (`sao.transport.admission`), which depend on the trainer's config.
  OUT_OF_RANGE = 12
  TOO_LONG = 13
  # Transport-level reasons, raised by the trainer-side service rather than by `validate`.
  UNKNOWN_LEASE = 20
  STALE_POLICY = 21
  DUPLICATE = 22
  BACKPRESSURE = 23
  INTERNAL = 24
  FUTURE_POLICY = 25
  WRONG_WORKER = 26


class TrajectoryError(ValueError):
  """A trajectory that breaks the contract. `field` names the offending field; `reason_code` is a `ReasonCode`."""

  def __init__(self, field: str, reason_code: ReasonCode, detail: str):
    self.field = field
    self.reason_code = ReasonCode(reason_code)
    self.detail = detail
    super().__init__(f"trajectory field {field!r}: {detail} [{self.reason_code.name}]")


_STATUS_TO_PROTO = {
    Status.OK: sao_pb2.TRAJECTORY_STATUS_OK,
    Status.TIMEOUT: sao_pb2.TRAJECTORY_STATUS_TIMEOUT,
    Status.ENV_ERROR: sao_pb2.TRAJECTORY_STATUS_ENV_ERROR,
    Status.TRUNCATED: sao_pb2.TRAJECTORY_STATUS_TRUNCATED,
}
_STATUS_FROM_PROTO = {v: k for k, v in _STATUS_TO_PROTO.items()}


def _vector(field: str, value: Any, kinds: str, expected: str, empty_dtype: np.dtype) -> np.ndarray:
  """`value` as a 1-D array of a dtype kind in `kinds` (numpy's `dtype.kind` letters); an empty one as `empty_dtype`
  whatever dtype it came with (`[]` is float64). TrajectoryError naming `field` for another shape or kind."""
  arr = np.asarray(value)
  if arr.ndim != 1:
    raise TrajectoryError(field, ReasonCode.INVALID_FIELD, f"expected a 1-D array, got shape {arr.shape}")
  if arr.size == 0:
    return np.zeros((0,), empty_dtype)
  if arr.dtype.kind not in kinds:
    raise TrajectoryError(field, ReasonCode.INVALID_FIELD, f"expected {expected}, got dtype {arr.dtype}")
  return arr


def _int_array(field: str, value: Any) -> np.ndarray:
  """`value` as a 1-D int32 array; raises rather than wrap or truncate (a wrapped id would pass the range check)."""
  arr = _vector(field, value, "iu", "integers", np.int32)
  if arr.size and (arr.min() < _INT32_MIN or arr.max() > _INT32_MAX):
    code = {"token_ids": ReasonCode.TOKEN_OUT_OF_RANGE,
            "turn_boundaries": ReasonCode.BAD_TURN_BOUNDARIES}.get(field, ReasonCode.INVALID_FIELD)
    raise TrajectoryError(field, code, f"values outside int32: [{arr.min()}, {arr.max()}]")
  return arr.astype(np.int32)


def _bool_array(field: str, value: Any) -> np.ndarray:
  """`value` as a 1-D bool array; integers are accepted only when every entry is 0 or 1."""
  arr = _vector(field, value, "biu", "booleans (0/1)", bool)
  if arr.dtype != bool and not np.isin(arr, (0, 1)).all():
    raise TrajectoryError(field, ReasonCode.INVALID_FIELD, f"expected booleans (0/1), got dtype {arr.dtype}")
  return arr.astype(bool, copy=False)


def _float_array(field: str, value: Any) -> np.ndarray:
  """`value` as a 1-D float32 array (non-finite values are kept: `validate` reports them)."""
  arr = _vector(field, value, "fiu", "floats", np.float32)
  with np.errstate(over="ignore"):  # a float64 beyond float32 becomes inf, which validate() then rejects
    return arr.astype(np.float32)


def _arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
  """Bitwise equality (dtype, shape and bytes), so a round trip is checked exactly."""
  return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@dataclasses.dataclass(eq=False)
class Trajectory:
  """One finished episode (see the module docstring for array shapes).

  Attributes:
    task_id: the task's id (from the task dispenser).
    sample_index: index of this rollout within its group (GSPO); 0 for SAO.
    group_id: rollouts of one task that are advantaged together share a group id.
    policy_version: the weights version that sampled the action tokens.
    token_ids, action_mask, rollout_logprobs: see module docstring.
    reward: the environment's scalar outcome reward (placed on `reward_token_index()` by the learner).
    turn_boundaries: token offset where each message starts; strictly increasing, inside [0, T).
    num_turns: number of assistant (model) turns.
    status: one of `Status`.
    harness: which agent scaffold produced it ("sao", "openhands", ...).
    timings: seconds spent per phase ("generate", "tool", "total", ...).
    metrics: extra scalar diagnostics.
    lease_id: the lease under which the task was run (the transport matches it to the dispenser's lease).
    metadata: free-form string annotations.
    routed_experts: see the module docstring (None: not recorded).
  """
  task_id: str
  token_ids: np.ndarray
  action_mask: np.ndarray
  rollout_logprobs: np.ndarray
  reward: float
  policy_version: int = 0
  sample_index: int = 0
  group_id: str = ""
  turn_boundaries: tuple[int, ...] = ()
  num_turns: int = 0
  status: str = Status.OK
  harness: str = ""
  timings: dict[str, float] = dataclasses.field(default_factory=dict)
  metrics: dict[str, float] = dataclasses.field(default_factory=dict)
  lease_id: str = ""
  metadata: dict[str, str] = dataclasses.field(default_factory=dict)
  routed_experts: np.ndarray | None = None

  def __post_init__(self):
    if self.routed_experts is not None:
      routed = np.asarray(self.routed_experts)
      if routed.ndim != 2 or routed.dtype.kind not in "iu" or routed.shape[1] < 1:
        raise TrajectoryError("routed_experts", ReasonCode.INVALID_FIELD,
                              f"expected int [tokens, layers·top_k], got {routed.dtype} {routed.shape}")
      if routed.size and (routed.min() < -1 or routed.max() > _INT32_MAX):
        raise TrajectoryError("routed_experts", ReasonCode.INVALID_FIELD,
                              f"ids in [{routed.min()}, {routed.max()}], outside [-1, int32]")
      self.routed_experts = routed.astype(np.int32)
    self.token_ids = _int_array("token_ids", self.token_ids)
    self.action_mask = _bool_array("action_mask", self.action_mask)
    self.rollout_logprobs = _float_array("rollout_logprobs", self.rollout_logprobs)
    self.turn_boundaries = tuple(int(b) for b in _int_array("turn_boundaries", list(self.turn_boundaries)))
    self.reward = float(self.reward)
    self.policy_version = int(self.policy_version)
    self.sample_index = int(self.sample_index)
    self.num_turns = int(self.num_turns)
    if self.status in Status.__members__.values():
      self.status = Status(self.status)
    self.timings = {str(k): float(v) for k, v in self.timings.items()}
    self.metrics = {str(k): float(v) for k, v in self.metrics.items()}
    self.metadata = {str(k): str(v) for k, v in self.metadata.items()}

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, Trajectory):
      return NotImplemented
    for f in dataclasses.fields(self):
      a, b = getattr(self, f.name), getattr(other, f.name)
      if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and _arrays_equal(a, b)):
          return False
      elif a != b:
        return False
    return True

  __hash__ = None  # mutable, holds arrays

  # ----------------------------------------------------------------------------------------------------------------
  # Derived quantities.

  @property
  def num_tokens(self) -> int:
    return int(self.token_ids.shape[0])

  @property
  def num_action_tokens(self) -> int:
    return int(self.action_mask.sum())

  @property
  def is_trainable(self) -> bool:
    """Timeouts and environment failures are dropped, not trained on (docs/algorithm.md)."""
    return self.status in (Status.OK, Status.TRUNCATED)

  def reward_token_index(self) -> int:
    """Index of the last action token: where the outcome reward goes (an episode usually ends on an observation)."""
    idx = np.flatnonzero(self.action_mask)
    if idx.size == 0:
      raise TrajectoryError("action_mask", ReasonCode.NO_ACTION_TOKEN, "no action token to carry the reward")
    return int(idx[-1])

  def staleness(self, trainer_version: int) -> int:
    """How many policy versions the trainer is ahead of the policy that produced this trajectory."""
    return int(trainer_version) - self.policy_version

  # ----------------------------------------------------------------------------------------------------------------
  # Validation.

  def validate(self, vocab_size: int) -> None:
    """Checks everything the learner assumes; raises `TrajectoryError` naming the first offending field."""
    if not self.task_id:
      raise TrajectoryError("task_id", ReasonCode.INVALID_FIELD, "empty task id")
    if self.policy_version < 0:
      raise TrajectoryError("policy_version", ReasonCode.NEGATIVE_POLICY_VERSION,
                            f"must be >= 0, got {self.policy_version}")
    if self.sample_index < 0:
      raise TrajectoryError("sample_index", ReasonCode.INVALID_FIELD, f"must be >= 0, got {self.sample_index}")
    if self.num_turns < 0:
      raise TrajectoryError("num_turns", ReasonCode.INVALID_FIELD, f"must be >= 0, got {self.num_turns}")
    if not isinstance(self.status, Status):
      raise TrajectoryError("status", ReasonCode.UNKNOWN_STATUS,
                            f"{self.status!r} is not one of {[s.value for s in Status]}")
    if not math.isfinite(self.reward):
      raise TrajectoryError("reward", ReasonCode.NON_FINITE, f"must be finite, got {self.reward}")
    for name, values in (("timings", self.timings), ("metrics", self.metrics)):
      for key, value in values.items():
        if not math.isfinite(value):
          raise TrajectoryError(f"{name}[{key!r}]", ReasonCode.NON_FINITE, f"must be finite, got {value}")
    self._validate_arrays(vocab_size)
    self._validate_turn_boundaries()
    if self.routed_experts is not None and len(self.routed_experts) > self.num_tokens:
      raise TrajectoryError("routed_experts", ReasonCode.LENGTH_MISMATCH,
                            f"{len(self.routed_experts)} rows for {self.num_tokens} tokens")

  def _validate_arrays(self, vocab_size: int) -> None:
    t = self.num_tokens
    if t == 0:
      raise TrajectoryError("token_ids", ReasonCode.EMPTY, "trajectory has no tokens")
    for name in ("action_mask", "rollout_logprobs"):
      n = getattr(self, name).shape[0]
      if n != t:
        raise TrajectoryError(name, ReasonCode.LENGTH_MISMATCH, f"length {n} != len(token_ids) {t}")
    bad = np.flatnonzero((self.token_ids < 0) | (self.token_ids >= vocab_size))
    if bad.size:
      raise TrajectoryError("token_ids", ReasonCode.TOKEN_OUT_OF_RANGE,
                            f"token {self.token_ids[bad[0]]} at position {bad[0]} outside [0, {vocab_size})")
    if not self.action_mask.any():
      raise TrajectoryError("action_mask", ReasonCode.NO_ACTION_TOKEN, "no action token (all zero)")
    lp = self.rollout_logprobs
    bad = np.flatnonzero(~np.isfinite(lp))
    if bad.size:
      raise TrajectoryError("rollout_logprobs", ReasonCode.NON_FINITE,
                            f"value {lp[bad[0]]} at position {bad[0]}")
    bad = np.flatnonzero(~self.action_mask & (lp != 0))
    if bad.size:
      raise TrajectoryError("rollout_logprobs", ReasonCode.OBSERVATION_LOGPROB,
                            f"non-zero value {lp[bad[0]]} at observation position {bad[0]} (action_mask 0)")
    bad = np.flatnonzero(lp > 0)
    if bad.size:
      raise TrajectoryError("rollout_logprobs", ReasonCode.POSITIVE_LOGPROB,
                            f"positive log-prob {lp[bad[0]]} at position {bad[0]}")

  def _validate_turn_boundaries(self) -> None:
    b = self.turn_boundaries
    for i, offset in enumerate(b):
      if not 0 <= offset < self.num_tokens:
        raise TrajectoryError("turn_boundaries", ReasonCode.BAD_TURN_BOUNDARIES,
                              f"offset {offset} at index {i} outside [0, {self.num_tokens})")
      if i and offset <= b[i - 1]:
        raise TrajectoryError("turn_boundaries", ReasonCode.BAD_TURN_BOUNDARIES,
                              f"not strictly increasing at index {i}: {b[i - 1]} then {offset}")

  # ----------------------------------------------------------------------------------------------------------------
  # Wire format.

  def to_proto(self) -> sao_pb2.Trajectory:
    """The `sao.transport.v1.Trajectory` message. Exact: `from_proto(t.to_proto()) == t`."""
    if not isinstance(self.status, Status):
      raise TrajectoryError("status", ReasonCode.UNKNOWN_STATUS, f"{self.status!r} has no wire encoding")
    return sao_pb2.Trajectory(
        task_id=self.task_id,
        sample_index=self.sample_index,
        group_id=self.group_id,
        policy_version=self.policy_version,
        token_ids=self.token_ids.tolist(),
        action_mask=self.action_mask.astype(np.uint8).tobytes(),
        rollout_logprobs=self.rollout_logprobs.tolist(),
        reward=self.reward,
        turn_boundaries=list(self.turn_boundaries),
        num_turns=self.num_turns,
        status=_STATUS_TO_PROTO[self.status],
        harness=self.harness,
        timings=self.timings,
        metrics=self.metrics,
        lease_id=self.lease_id,
        metadata=self.metadata,
        **self._routed_experts_fields(),
    )

  def _routed_experts_fields(self) -> dict[str, Any]:
    if self.routed_experts is None:
      return {}
    return {"routed_experts": self.routed_experts.astype("<i4").tobytes(),
            "routed_experts_columns": self.routed_experts.shape[1]}

  @classmethod
  def from_proto(cls, msg: sao_pb2.Trajectory) -> Trajectory:
    """Decodes a wire message; raises `TrajectoryError` for what cannot be represented (bad mask byte, status)."""
    if msg.status not in _STATUS_FROM_PROTO:
      raise TrajectoryError("status", ReasonCode.UNKNOWN_STATUS,
                            f"wire value {msg.status} is not a known TrajectoryStatus")
    return cls(
        task_id=msg.task_id,
        sample_index=msg.sample_index,
        group_id=msg.group_id,
        policy_version=msg.policy_version,
        token_ids=np.asarray(msg.token_ids, np.int32),
        action_mask=np.frombuffer(msg.action_mask, np.uint8).copy(),
        rollout_logprobs=np.asarray(msg.rollout_logprobs, np.float32),
        reward=msg.reward,
        turn_boundaries=tuple(msg.turn_boundaries),
        num_turns=msg.num_turns,
        status=_STATUS_FROM_PROTO[msg.status],
        harness=msg.harness,
        timings=dict(msg.timings),
        metrics=dict(msg.metrics),
        lease_id=msg.lease_id,
        metadata=dict(msg.metadata),
        routed_experts=_routed_experts_from_proto(msg),
    )

  def to_bytes(self) -> bytes:
    """Serialized proto (for the durable trajectory log)."""
    return self.to_proto().SerializeToString()

  @classmethod
  def from_bytes(cls, data: bytes) -> Trajectory:
    msg = sao_pb2.Trajectory()
    msg.ParseFromString(data)
    return cls.from_proto(msg)


def _routed_experts_from_proto(msg: sao_pb2.Trajectory) -> np.ndarray | None:
  """The wire's routed experts as int32 [R, C], or None when the message carries none."""
  columns, raw = msg.routed_experts_columns, msg.routed_experts
  if columns == 0 and not raw:
    return None
  if columns < 1 or len(raw) % (4 * columns):
    raise TrajectoryError("routed_experts", ReasonCode.INVALID_FIELD,
                          f"{len(raw)} bytes do not split into rows of {columns} int32 ids")
  return np.frombuffer(raw, "<i4").astype(np.int32).reshape(-1, columns)


def reject_result(error: TrajectoryError, retry_after_ms: int = 0) -> sao_pb2.SubmitResult:
  """The `SubmitResult` that reports `error` to the worker."""
  return sao_pb2.SubmitResult(accepted=False, reason=int(error.reason_code), message=str(error),
                              retry_after_ms=retry_after_ms, field=error.field)


def field_summary(traj: Trajectory) -> Mapping[str, Any]:
  """A compact, JSON-friendly summary for logs (no token arrays)."""
  return {
      "task_id": traj.task_id, "sample_index": traj.sample_index, "group_id": traj.group_id,
      "policy_version": traj.policy_version, "num_tokens": traj.num_tokens,
      "num_action_tokens": traj.num_action_tokens, "reward": traj.reward, "num_turns": traj.num_turns,
      "status": str(traj.status), "harness": traj.harness,
  }
