"""Shared helpers of the transport tests: a valid trajectory for a lease, a running server, raw gRPC stubs."""
import contextlib

import grpc

from sao.transport import sao_pb2
from sao.transport import sao_pb2_grpc
from sao.transport.dispenser import DispenserConfig, TaskDispenser
from sao.transport.server import ServerConfig, TrajectoryServer
from sao.transport.trajectory import Trajectory

VOCAB = 100
TASKS = [{"id": f"task{i}"} for i in range(16)]


def make_traj(task: sao_pb2.LeasedTask, sample_index: int = 0, version: int = 0, **overrides) -> Trajectory:
  """A valid 6-token trajectory for `task` (prompt 2, action 2, observation 1, action 1)."""
  kwargs = dict(task_id=task.task_id, lease_id=task.lease_id, sample_index=sample_index, group_id=task.group_id,
                policy_version=version, token_ids=[1, 2, 10, 11, 3, 12], action_mask=[0, 0, 1, 1, 0, 1],
                rollout_logprobs=[0, 0, -0.5, -1.0, 0, -0.2], reward=1.0, turn_boundaries=(0, 2, 4, 5),
                num_turns=2, status="ok")
  kwargs.update(overrides)
  return Trajectory(**kwargs)


@contextlib.contextmanager
def running(tmp_path, tasks=TASKS, dispenser_config=None, validation_tasks=(), dispenser_state=None,
            **server_overrides):
  """A started server on 127.0.0.1 (port 0 unless given), always stopped afterwards."""
  dispenser = TaskDispenser(tasks, dispenser_config or DispenserConfig(), validation_tasks)
  config = ServerConfig(log_dir=str(tmp_path / "trajectories"), vocab_size=VOCAB, **server_overrides)
  server = TrajectoryServer(config, dispenser)
  server.restore(dispenser_state)
  server.start()
  try:
    yield server
  finally:
    server.stop(grace_s=0.5)


def stub_for(server):
  channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
  return channel, sao_pb2_grpc.TrajectoryServiceStub(channel)


def submit_raw(stub, protos, **kw):
  return stub.SubmitTrajectories(sao_pb2.SubmitRequest(worker_id="w", trajectories=protos), timeout=10, **kw).results
