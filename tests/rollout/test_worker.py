"""Rollout worker against a real in-process TrajectoryServer and a scripted engine: lease lifetime under backpressure.

A trajectory the trainer pushes back (BACKPRESSURE) must keep its lease alive until it is acknowledged (else it is
rejected later as UNKNOWN_LEASE and its task re-run), and a worker whose finished samples wait for acknowledgement
must not lease more work (else outstanding leases grow without bound while the learner is slow).
"""
import asyncio
import os
import subprocess
import sys
import threading
import time

import grpc
import pytest

from sao.engines.sglang_client import GenerateResult
from sao.models.tokenizer import toy_tokenizer
from sao.rollout import envs
from sao.rollout import worker as worker_lib
from sao.rollout.worker import RolloutWorker, WorkerConfig
from sao.transport.dispenser import DispenserConfig, TaskDispenser
from sao.transport.server import ServerConfig, TrajectoryServer

CONCURRENCY = 4
# Heartbeats go every TTL/3, so a lease lapses only if the worker's process stalls for 2/3 of the TTL: 1 s (a 0.67 s
# stall) lapsed every lease at once on a loaded 2-core machine, and their trajectories came back UNKNOWN_LEASE.
LEASE_TTL_S = 2.5
LEARNER_INTERVAL_S = 1.2 * LEASE_TTL_S  # longer than a TTL: a pushed-back sample outlives its lease's TTL unless held


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
    # A learner much slower than the rollouts: one trajectory per LEARNER_INTERVAL_S (the worker's samples wait for
    # up to CONCURRENCY - 1 of them). The deadline is only a bound against a hang.
    deadline = time.monotonic() + 120
    while consumed < 4 and time.monotonic() < deadline:
      batch = server.take_batch(1, timeout_s=0.1)
      max_leased = max(max_leased, dispenser.num_leased)
      if batch:
        server.mark_consumed(batch, consumed)
        consumed += 1
        end = time.monotonic() + LEARNER_INTERVAL_S
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
  assert elapsed < 30, elapsed  # the retry budget is ≥ 60 s: stopped, not waited out (generous for a loaded machine)
  assert stats["submitted"] == 0


# ---------------------------------------------------------------------------------------------------------------
# The worker program reads the trainer's experiment config (`--config=<file>:<arg>`), not flags copied one by one.

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _experiment(arg: str):
  from experiments.configs import sao_openswe  # pylint: disable=g-import-not-at-top
  return sao_openswe.get_config(arg)


def test_worker_config_comes_from_the_experiment_config():
  config = _experiment("toy")
  wc = worker_lib.worker_config(config, "127.0.0.1:5", worker_index=3)
  r = config.rollout
  assert (wc.trainer_address, wc.concurrency, wc.max_new_tokens, wc.max_turns, wc.max_total_tokens) == (
      "127.0.0.1:5", r.concurrency, r.max_new_tokens, r.max_turns, r.max_total_tokens)
  assert wc.tokenizer_path == "" and wc.engine_urls == () and wc.harness_seed == config.seed
  assert wc.env_kwargs == {"number_search": config.env.kwargs.to_dict()}
  assert wc.harness_mixture.names == ("xml_json",) and wc.harness_mixture.eval_harness == "xml_json"
  assert wc.worker_id.startswith("sao_openswe_toy-worker3-")

  swe = worker_lib.worker_config(_experiment("swe_toy,seed=4,engine_urls=http://e:1"), "t:1")
  assert swe.harness_mixture.names == ("openai_tools", "bash_only") and swe.harness_mixture.weights == (1.0, 1.0)
  assert swe.harness_seed == 4 and swe.engine_urls == ("http://e:1",) and set(swe.env_kwargs) == {"swe"}
  full = worker_lib.worker_config(_experiment("full"), "t:1")
  assert full.tokenizer_path == "Qwen/Qwen3.5-35B-A3B"  # an hf-initialised model's own tokenizer


def test_worker_command_carries_the_trainers_config_flags():
  cmd = worker_lib.command(["--config=experiments/configs/sao_openswe.py:toy", "--config.seed=2"], "h:7", 1,
                           python="py")
  assert cmd == ["py", "-m", "sao.rollout.worker", "--config=experiments/configs/sao_openswe.py:toy",
                 "--config.seed=2", "--trainer=h:7", "--worker_index=1"]


@pytest.mark.parametrize("override,message", [
    ("--config.rollout.concurrency=0", "concurrency: must be >= 1, got 0"),  # the override reached WorkerConfig
    ("--config.jax_distributed=ture", "Non-boolean argument to boolean flag"),
    ("--config.rollout.harnesses=('claude_code',)", "'claude_code' is not a registered harness"),
])
def test_worker_program_parses_config_overrides_strictly(override, message):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]), JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, "-m", "sao.rollout.worker",
                           "--config=experiments/configs/sao_openswe.py:toy", override, "--trainer=127.0.0.1:1"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
  assert result.returncode != 0 and message in result.stderr + result.stdout, result.stderr[-3000:]


class _PermissionDenied(grpc.RpcError):

  def code(self):
    return grpc.StatusCode.PERMISSION_DENIED

  def details(self):
    return "injected"


def test_a_failed_heartbeat_loop_stops_the_worker(tmp_path):
  """Without heartbeats every lease lapses: a heartbeat that fails for good ends the run with its error instead of
  leaving the worker running (its exception used to sit unretrieved in the cancelled task)."""
  tokenizer = toy_tokenizer()
  tasks = envs.make("number_search", n=4).tasks("train", 16, seed=0)
  dispenser = TaskDispenser(tasks, DispenserConfig(mode="sao", lease_ttl_s=0.6, id_key="task_id",
                                                   env_name="number_search"))
  # The learner never takes a batch: finished samples wait for acknowledgement and their leases need heartbeats.
  server = TrajectoryServer(ServerConfig(log_dir=str(tmp_path / "log"), vocab_size=tokenizer.vocab_size,
                                         buffer_capacity=1, backpressure_retry_ms=50, no_work_retry_ms=50),
                            dispenser)
  port = server.start()
  worker = RolloutWorker(WorkerConfig(trainer_address=f"127.0.0.1:{port}", concurrency=2, max_turns=4,
                                      max_total_tokens=512, submit_interval_s=0.05, submit_batch=2), tokenizer)
  engine = GuessOneEngine(tokenizer)
  worker._engine = lambda urls: engine  # pylint: disable=protected-access

  def heartbeat(lease_ids):
    del lease_ids
    raise _PermissionDenied()

  worker.client.heartbeat = heartbeat
  try:
    with pytest.raises(grpc.RpcError) as raised:
      asyncio.run(asyncio.wait_for(worker.run(), timeout=60))  # the bound only catches a hang
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED
  finally:
    worker.stop()
    server.stop()
