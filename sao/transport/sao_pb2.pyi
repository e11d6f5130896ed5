from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TrajectoryStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAJECTORY_STATUS_UNSPECIFIED: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_OK: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_TIMEOUT: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_ENV_ERROR: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_TRUNCATED: _ClassVar[TrajectoryStatus]

class RejectReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REJECT_REASON_NONE: _ClassVar[RejectReason]
    REJECT_REASON_INVALID_FIELD: _ClassVar[RejectReason]
    REJECT_REASON_EMPTY: _ClassVar[RejectReason]
    REJECT_REASON_LENGTH_MISMATCH: _ClassVar[RejectReason]
    REJECT_REASON_NON_FINITE: _ClassVar[RejectReason]
    REJECT_REASON_POSITIVE_LOGPROB: _ClassVar[RejectReason]
    REJECT_REASON_TOKEN_OUT_OF_RANGE: _ClassVar[RejectReason]
    REJECT_REASON_NO_ACTION_TOKEN: _ClassVar[RejectReason]
    REJECT_REASON_OBSERVATION_LOGPROB: _ClassVar[RejectReason]
    REJECT_REASON_UNKNOWN_STATUS: _ClassVar[RejectReason]
    REJECT_REASON_BAD_TURN_BOUNDARIES: _ClassVar[RejectReason]
    REJECT_REASON_NEGATIVE_POLICY_VERSION: _ClassVar[RejectReason]
    REJECT_REASON_OUT_OF_RANGE: _ClassVar[RejectReason]
    REJECT_REASON_TOO_LONG: _ClassVar[RejectReason]
    REJECT_REASON_UNKNOWN_LEASE: _ClassVar[RejectReason]
    REJECT_REASON_STALE_POLICY: _ClassVar[RejectReason]
    REJECT_REASON_DUPLICATE: _ClassVar[RejectReason]
    REJECT_REASON_BACKPRESSURE: _ClassVar[RejectReason]
    REJECT_REASON_INTERNAL: _ClassVar[RejectReason]
    REJECT_REASON_FUTURE_POLICY: _ClassVar[RejectReason]
    REJECT_REASON_WRONG_WORKER: _ClassVar[RejectReason]
TRAJECTORY_STATUS_UNSPECIFIED: TrajectoryStatus
TRAJECTORY_STATUS_OK: TrajectoryStatus
TRAJECTORY_STATUS_TIMEOUT: TrajectoryStatus
TRAJECTORY_STATUS_ENV_ERROR: TrajectoryStatus
TRAJECTORY_STATUS_TRUNCATED: TrajectoryStatus
REJECT_REASON_NONE: RejectReason
REJECT_REASON_INVALID_FIELD: RejectReason
REJECT_REASON_EMPTY: RejectReason
REJECT_REASON_LENGTH_MISMATCH: RejectReason
REJECT_REASON_NON_FINITE: RejectReason
REJECT_REASON_POSITIVE_LOGPROB: RejectReason
REJECT_REASON_TOKEN_OUT_OF_RANGE: RejectReason
REJECT_REASON_NO_ACTION_TOKEN: RejectReason
REJECT_REASON_OBSERVATION_LOGPROB: RejectReason
REJECT_REASON_UNKNOWN_STATUS: RejectReason
REJECT_REASON_BAD_TURN_BOUNDARIES: RejectReason
REJECT_REASON_NEGATIVE_POLICY_VERSION: RejectReason
REJECT_REASON_OUT_OF_RANGE: RejectReason
REJECT_REASON_TOO_LONG: RejectReason
REJECT_REASON_UNKNOWN_LEASE: RejectReason
REJECT_REASON_STALE_POLICY: RejectReason
REJECT_REASON_DUPLICATE: RejectReason
REJECT_REASON_BACKPRESSURE: RejectReason
REJECT_REASON_INTERNAL: RejectReason
REJECT_REASON_FUTURE_POLICY: RejectReason
REJECT_REASON_WRONG_WORKER: RejectReason

class Trajectory(_message.Message):
    __slots__ = ("task_id", "sample_index", "group_id", "policy_version", "token_ids", "action_mask", "rollout_logprobs", "reward", "turn_boundaries", "num_turns", "status", "harness", "timings", "metrics", "lease_id", "metadata", "routed_experts", "routed_experts_columns")
    class TimingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    ACTION_MASK_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    TURN_BOUNDARIES_FIELD_NUMBER: _ClassVar[int]
    NUM_TURNS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HARNESS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ROUTED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    ROUTED_EXPERTS_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    sample_index: int
    group_id: str
    policy_version: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    action_mask: bytes
    rollout_logprobs: _containers.RepeatedScalarFieldContainer[float]
    reward: float
    turn_boundaries: _containers.RepeatedScalarFieldContainer[int]
    num_turns: int
    status: TrajectoryStatus
    harness: str
    timings: _containers.ScalarMap[str, float]
    metrics: _containers.ScalarMap[str, float]
    lease_id: str
    metadata: _containers.ScalarMap[str, str]
    routed_experts: bytes
    routed_experts_columns: int
    def __init__(self, task_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., group_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., action_mask: _Optional[bytes] = ..., rollout_logprobs: _Optional[_Iterable[float]] = ..., reward: _Optional[float] = ..., turn_boundaries: _Optional[_Iterable[int]] = ..., num_turns: _Optional[int] = ..., status: _Optional[_Union[TrajectoryStatus, str]] = ..., harness: _Optional[str] = ..., timings: _Optional[_Mapping[str, float]] = ..., metrics: _Optional[_Mapping[str, float]] = ..., lease_id: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., routed_experts: _Optional[bytes] = ..., routed_experts_columns: _Optional[int] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("worker_id", "max_tasks")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_TASKS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    max_tasks: int
    def __init__(self, worker_id: _Optional[str] = ..., max_tasks: _Optional[int] = ...) -> None: ...

class LeasedTask(_message.Message):
    __slots__ = ("lease_id", "task_id", "task_json", "group_id", "num_samples", "is_validation", "temperature", "env_name", "lease_ttl_ms", "sample_indices")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_JSON_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    IS_VALIDATION_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    ENV_NAME_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDICES_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    task_id: str
    task_json: str
    group_id: str
    num_samples: int
    is_validation: bool
    temperature: float
    env_name: str
    lease_ttl_ms: int
    sample_indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, lease_id: _Optional[str] = ..., task_id: _Optional[str] = ..., task_json: _Optional[str] = ..., group_id: _Optional[str] = ..., num_samples: _Optional[int] = ..., is_validation: _Optional[bool] = ..., temperature: _Optional[float] = ..., env_name: _Optional[str] = ..., lease_ttl_ms: _Optional[int] = ..., sample_indices: _Optional[_Iterable[int]] = ...) -> None: ...

class LeaseResponse(_message.Message):
    __slots__ = ("tasks", "policy_version", "engine_urls", "retry_after_ms")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENGINE_URLS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[LeasedTask]
    policy_version: int
    engine_urls: _containers.RepeatedScalarFieldContainer[str]
    retry_after_ms: int
    def __init__(self, tasks: _Optional[_Iterable[_Union[LeasedTask, _Mapping]]] = ..., policy_version: _Optional[int] = ..., engine_urls: _Optional[_Iterable[str]] = ..., retry_after_ms: _Optional[int] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("worker_id", "trajectories")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    trajectories: _containers.RepeatedCompositeFieldContainer[Trajectory]
    def __init__(self, worker_id: _Optional[str] = ..., trajectories: _Optional[_Iterable[_Union[Trajectory, _Mapping]]] = ...) -> None: ...

class SubmitResult(_message.Message):
    __slots__ = ("accepted", "reason", "message", "retry_after_ms", "field")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: RejectReason
    message: str
    retry_after_ms: int
    field: str
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[_Union[RejectReason, str]] = ..., message: _Optional[str] = ..., retry_after_ms: _Optional[int] = ..., field: _Optional[str] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("results", "policy_version")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SubmitResult]
    policy_version: int
    def __init__(self, results: _Optional[_Iterable[_Union[SubmitResult, _Mapping]]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "lease_ids")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    lease_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker_id: _Optional[str] = ..., lease_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("extended_lease_ids", "expired_lease_ids", "policy_version")
    EXTENDED_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    extended_lease_ids: _containers.RepeatedScalarFieldContainer[str]
    expired_lease_ids: _containers.RepeatedScalarFieldContainer[str]
    policy_version: int
    def __init__(self, extended_lease_ids: _Optional[_Iterable[str]] = ..., expired_lease_ids: _Optional[_Iterable[str]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("policy_version", "buffered", "accepted", "rejected", "leased", "duplicates", "consumed", "rejected_by_reason", "in_learner", "buffer_capacity")
    class RejectedByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    IN_LEARNER_FIELD_NUMBER: _ClassVar[int]
    BUFFER_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    buffered: int
    accepted: int
    rejected: int
    leased: int
    duplicates: int
    consumed: int
    rejected_by_reason: _containers.ScalarMap[str, int]
    in_learner: int
    buffer_capacity: int
    def __init__(self, policy_version: _Optional[int] = ..., buffered: _Optional[int] = ..., accepted: _Optional[int] = ..., rejected: _Optional[int] = ..., leased: _Optional[int] = ..., duplicates: _Optional[int] = ..., consumed: _Optional[int] = ..., rejected_by_reason: _Optional[_Mapping[str, int]] = ..., in_learner: _Optional[int] = ..., buffer_capacity: _Optional[int] = ...) -> None: ...
