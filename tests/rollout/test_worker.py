"""Rollout worker against a real in-process TrajectoryServer and a scripted engine: lease lifetime under backpressure.

A trajectory the trainer pushes back (BACKPRESSURE) must keep its lease alive until it is acknowledged (else it is
rejected later as UNKNOWN_LEASE and its task re-run), and a worker whose finished samples wait for acknowledgement
must not lease more work (else outstanding leases grow without bound while the learner is slow).
"""
import asyncio
import threading
import time

from sao.engines.sglang_client import GenerateResult
from sao.models.tokenizer import toy_tokenizer
from sao.rollout import envs
from sao.rollout.worker import RolloutWorker, WorkerConfig
from sao.transport.dispenser import DispenserConfig, TaskDispenser
from sao.transport.server import ServerConfig, TrajectoryServer

CONCURRENCY = 4
LEASE_TTL_S = 1.0


class GuessOneEngine:
  """Always answers `compare(1)`: short, well-formed episodes (n=4: at most 4 turns)."""

  def __init__(self, tokenizer):
    self.ids = tokenizer.encode('<tool_call>{"name": "compare", "arguments": {"guess": 1}}</tool_call>') + \
        [tokenizer.eos_token_id]

  async def generate(self, input_ids, sampling_params):
    del input_ids, sampling_params
    await asyncio.sleep(0.01)
    return GenerateResult(tuple(self.ids), tuple([-0.5] * len(self.ids)), "stop", weight_version="0")


def test_pushed_back_trajectories_keep_their_leases_and_stop_leasing(tmp_path):
  tokenizer = toy_tokenizer()
  tasks = envs.make("number_search", n=4).tasks("train", 64, seed=0)
  dispenser = TaskDispenser(tasks, DispenserConfig(mode="sao", lease_ttl_s=LEASE_TTL_S, id_key="task_id",
                                                   env_name="number_search"))
  server = TrajectoryServer(ServerConfig(log_dir=str(tmp_path / "log"), vocab_size=tokenizer.vocab_size,
                                         buffer_capacity=1, backpressure_retry_ms=50, no_work_retry_ms=50),
                            dispenser)
  port = server.start()
  worker = RolloutWorker(WorkerConfig(trainer_address=f"127.0.0.1:{port}", concurrency=CONCURRENCY, max_turns=4,
                                      max_total_tokens=512, submit_interval_s=0.05, submit_batch=2), tokenizer)
  engine = GuessOneEngine(tokenizer)
  worker._engine = lambda urls: engine  # pylint: disable=protected-access
  thread = threading.Thread(target=lambda: asyncio.run(worker.run()), daemon=True)
  thread.start()
  consumed, max_leased = 0, 0
  try:
    # A learner much slower than the rollouts: one trajectory every 2.5 lease TTLs.
    deadline = time.monotonic() + 20
    while consumed < 4 and time.monotonic() < deadline:
      batch = server.take_batch(1, timeout_s=0.1)
      max_leased = max(max_leased, dispenser.num_leased)
      if batch:
        server.mark_consumed(batch, consumed)
        consumed += 1
        end = time.monotonic() + 2.5 * LEASE_TTL_S
        while time.monotonic() < end:
          max_leased = max(max_leased, dispenser.num_leased)
          time.sleep(0.05)
    # Stopping: the worker delivers what it holds (the learner keeps taking) and its leases stay alive meanwhile.
    worker.stop()
    deadline = time.monotonic() + 30
    while thread.is_alive() and time.monotonic() < deadline:
      batch = server.take_batch(1, timeout_s=0.1)
      if batch:
        server.mark_consumed(batch, consumed)
        consumed += 1
  finally:
    worker.stop()
    thread.join(timeout=30)
    stats = server.stats()
    server.stop()
  assert consumed >= 4
  assert not thread.is_alive()
  assert "UNKNOWN_LEASE" not in stats["rejected_by_reason"], stats
  assert worker.stats["rejected"] == 0, worker.stats
  assert max_leased <= CONCURRENCY, max_leased  # finished-but-unacknowledged samples hold their slots
  assert stats["duplicates"] == 0


def test_stop_does_not_wait_out_the_retry_budget_when_the_trainer_is_gone():
  # Nothing listens on this port: every lease is UNAVAILABLE and the client would retry for 60 s.
  import socket  # pylint: disable=g-import-not-at-top
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  worker = RolloutWorker(WorkerConfig(trainer_address=f"127.0.0.1:{port}", concurrency=2))
  assert worker.client.retry_budget_s >= 60

  async def run():
    task = asyncio.create_task(worker.run())
    await asyncio.sleep(1.0)  # inside the lease call's retry loop
    assert not task.done()
    start = time.monotonic()
    worker.stop()
    stats = await asyncio.wait_for(task, timeout=10)
    return time.monotonic() - start, stats

  elapsed, stats = asyncio.run(run())
  assert elapsed < 5, elapsed
  assert stats["submitted"] == 0
