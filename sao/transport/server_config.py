"""The knobs of the trainer-side `TrajectoryService` (`sao.transport.server`), checked when constructed."""
from __future__ import annotations

import dataclasses

from sao.transport.admission import DEFAULT_MAX_ABS_REWARD, DEFAULT_MIN_LOGPROB, ContentLimits


@dataclasses.dataclass
class ServerConfig:
  """Knobs of the trainer-side service.

  Attributes:
    log_dir: the durable trajectory log directory (e.g. `<workdir>/trajectories`).
    vocab_size: token ids must lie in [0, vocab_size).
    host, port: bind address; port 0 picks a free port (`TrajectoryServer.port` tells which).
    token: shared secret workers send as `authorization: Bearer <token>`; required for a non-loopback host.
    tls_cert_path, tls_key_path: PEM files; when given the port is TLS-only.
    buffer_capacity: the most trajectories held (buffered + reserved for open groups).
    max_staleness: accept `policy_version >= current_version - max_staleness`.
    backpressure_retry_ms: the retry hint sent with BACKPRESSURE (and INTERNAL) rejects.
    no_work_retry_ms: the retry hint of an empty lease response.
    max_lease_per_call: cap on `max_tasks` of one LeaseTasks call.
    max_outstanding: the most training samples leased or buffered at once (0 = no limit): bounds how far rollouts
      run ahead of the learner, hence staleness.
    engine_urls: sent to workers with every lease.
    max_workers: gRPC handler threads.
    max_message_bytes: gRPC receive limit (a request holds whole trajectories).
    segment_bytes: log segment rotation size.
    max_tokens: the longest trajectory accepted (tokens): the learner's largest batch bucket.
    max_abs_reward, min_logprob: accepted rewards lie in [-max_abs_reward, max_abs_reward], action log-probs in
      [min_logprob, 0] (`sao.transport.admission` says why these defaults).
  """
  log_dir: str
  vocab_size: int
  host: str = "127.0.0.1"
  port: int = 0
  token: str | None = None
  tls_cert_path: str | None = None
  tls_key_path: str | None = None
  buffer_capacity: int = 1024
  max_staleness: int = 1
  backpressure_retry_ms: int = 200
  no_work_retry_ms: int = 1000
  max_lease_per_call: int = 64
  max_outstanding: int = 0
  engine_urls: tuple[str, ...] = ()
  max_workers: int = 16
  max_message_bytes: int = 64 << 20
  segment_bytes: int = 64 << 20
  max_tokens: int = 32768
  max_abs_reward: float = DEFAULT_MAX_ABS_REWARD
  min_logprob: float = DEFAULT_MIN_LOGPROB

  def __post_init__(self):
    for name in ("vocab_size", "max_tokens", "buffer_capacity", "max_lease_per_call", "max_workers",
                 "max_message_bytes"):
      if getattr(self, name) <= 0:
        raise ValueError(f"ServerConfig.{name} must be > 0, got {getattr(self, name)}")
    if self.max_staleness < 0:
      raise ValueError(f"ServerConfig.max_staleness must be >= 0, got {self.max_staleness}")
    if (self.tls_cert_path is None) != (self.tls_key_path is None):
      raise ValueError("ServerConfig.tls_cert_path and tls_key_path must be given together")
    self.content_limits()  # raises on bad ranges now, not at the first submission

  def content_limits(self) -> ContentLimits:
    return ContentLimits(self.vocab_size, self.max_tokens, self.max_abs_reward, self.min_logprob)
