"""Tests for the trainer-side TrajectoryService and the worker-side client, over real gRPC on 127.0.0.1."""
import json
import shutil
import subprocess
import threading
import time

import grpc
import pytest

from sao.transport import sao_pb2
from sao.transport import sao_pb2_grpc
from sao.transport.client import TrajectoryClient
from sao.transport.dispenser import DispenserConfig, TaskDispenser
from sao.transport.server import ServerConfig, TrajectoryServer
from sao.transport.trajectory import ReasonCode

from tests.transport.helpers import TASKS, VOCAB, make_traj, running, stub_for, submit_raw


def test_lease_heartbeat_status_through_client(tmp_path):
  with running(tmp_path, engine_urls=("http://127.0.0.1:30000",)) as server, \
      TrajectoryClient(f"127.0.0.1:{server.port}") as client:
    server.set_policy_version(3)
    response = client.lease(2)
    assert len(response.tasks) == 2 and response.policy_version == 3
    assert list(response.engine_urls) == ["http://127.0.0.1:30000"]
    task = response.tasks[0]
    assert json.loads(task.task_json)["id"] == task.task_id and list(task.sample_indices) == [0]
    assert task.num_samples == 1 and task.lease_ttl_ms == 600_000
    hb = client.heartbeat([task.lease_id, "gone"])
    assert list(hb.extended_lease_ids) == [task.lease_id] and list(hb.expired_lease_ids) == ["gone"]
    (outcome,) = client.submit([make_traj(task, version=3)])
    assert outcome.accepted and not outcome.duplicate and outcome.reason == ReasonCode.NONE
    status = client.status()
    assert (status.policy_version, status.accepted, status.buffered, status.leased) == (3, 1, 1, 1)


def test_ten_kinds_of_malformed_trajectories_get_their_reason_and_server_keeps_serving(tmp_path):
  with running(tmp_path) as server:
    channel, stub = stub_for(server)
    tasks = stub.LeaseTasks(sao_pb2.LeaseRequest(worker_id="w", max_tasks=12), timeout=10).tasks
    good = lambda i, **kw: make_traj(tasks[i], **kw).to_proto()

    def wire(i, **fields):  # malformations the Trajectory constructor would not let us build
      msg = good(i)
      for k, v in fields.items():
        if isinstance(v, list):
          msg.ClearField(k)
          getattr(msg, k).extend(v)
        else:
          setattr(msg, k, v)
      return msg

    cases = [
        (wire(0, token_ids=[], action_mask=b"", rollout_logprobs=[], turn_boundaries=[]), ReasonCode.EMPTY),
        (wire(1, action_mask=b"\x00\x00\x01"), ReasonCode.LENGTH_MISMATCH),
        (good(2, rollout_logprobs=[0, 0, float("nan"), -1.0, 0, -0.2]), ReasonCode.NON_FINITE),
        (good(3, rollout_logprobs=[0, 0, 0.5, -1.0, 0, -0.2]), ReasonCode.POSITIVE_LOGPROB),
        (good(4, token_ids=[1, 2, 10, VOCAB, 3, 12]), ReasonCode.TOKEN_OUT_OF_RANGE),
        (good(5, action_mask=[0] * 6, rollout_logprobs=[0.0] * 6), ReasonCode.NO_ACTION_TOKEN),
        (good(6, rollout_logprobs=[-0.1, 0, -0.5, -1.0, 0, -0.2]), ReasonCode.OBSERVATION_LOGPROB),
        (wire(7, status=sao_pb2.TRAJECTORY_STATUS_UNSPECIFIED), ReasonCode.UNKNOWN_STATUS),
        (good(8, turn_boundaries=(0, 4, 2)), ReasonCode.BAD_TURN_BOUNDARIES),
        (wire(9, policy_version=-2), ReasonCode.NEGATIVE_POLICY_VERSION),
        (wire(10, lease_id="forged"), ReasonCode.UNKNOWN_LEASE),
        (wire(10, action_mask=b"\x00\x00\x02\x01\x00\x01"), ReasonCode.INVALID_FIELD),
    ]
    results = submit_raw(stub, [msg for msg, _ in cases])
    for (_, code), result in zip(cases, results):
      assert not result.accepted and result.reason == code, (code, result)
      assert result.message and result.field and result.retry_after_ms == 0
    # One at a time too (each request alone), then a valid one: the server is still serving.
    for msg, code in cases[:3]:
      assert submit_raw(stub, [msg])[0].reason == code
    assert submit_raw(stub, [good(11)])[0].accepted
    status = stub.GetStatus(sao_pb2.StatusRequest(), timeout=10)
    assert status.accepted == 1 and status.rejected == len(cases) + 3
    assert status.rejected_by_reason["EMPTY"] == 2 and status.rejected_by_reason["UNKNOWN_LEASE"] == 1
    channel.close()


def test_duplicates_are_acknowledged_and_counted_once(tmp_path):
  with running(tmp_path) as server:
    channel, stub = stub_for(server)
    (task,) = stub.LeaseTasks(sao_pb2.LeaseRequest(worker_id="w", max_tasks=1), timeout=10).tasks
    msg = make_traj(task).to_proto()
    first = submit_raw(stub, [msg, msg])
    assert first[0].accepted and first[0].reason == 0
    assert first[1].accepted and first[1].reason == sao_pb2.REJECT_REASON_DUPLICATE
    again = submit_raw(stub, [msg])[0]  # the lease is finished by now: dedup comes before the lease check
    assert again.accepted and again.reason == sao_pb2.REJECT_REASON_DUPLICATE
    status = stub.GetStatus(sao_pb2.StatusRequest(), timeout=10)
    assert (status.accepted, status.duplicates, status.buffered, status.rejected) == (1, 2, 1, 0)
    assert len(server.take_batch(1, timeout_s=1)) == 1 and server.take_batch(1, timeout_s=0.05) == []
    channel.close()


def test_stale_policy_version_is_rejected(tmp_path):
  with running(tmp_path, max_staleness=1) as server, TrajectoryClient(f"127.0.0.1:{server.port}") as client:
    server.set_policy_version(5)
    a, b = client.lease(2).tasks
    stale, fresh = client.submit([make_traj(a, version=3), make_traj(b, version=4)])
    assert not stale.accepted and stale.reason == ReasonCode.STALE_POLICY and stale.field == "policy_version"
    assert fresh.accepted
    # The stale sample's task is re-leased at once (not after its lease's TTL), and its lease no longer counts
    # against flow control.
    assert client.status().leased == 0
    (again,) = client.lease(1).tasks
    assert again.task_id == a.task_id and again.lease_id != a.lease_id
    assert client.submit([make_traj(again, version=5)])[0].accepted


def test_stale_sample_of_a_group_is_re_leased_alone(tmp_path):
  with running(tmp_path, dispenser_config=DispenserConfig(mode="group", group_size=2, seed=0),
               max_staleness=0) as server, \
      TrajectoryClient(f"127.0.0.1:{server.port}") as client:
    server.set_policy_version(2)
    (task,) = client.lease(1).tasks
    ok, stale = client.submit([make_traj(task, version=2, sample_index=0), make_traj(task, version=1,
                                                                                       sample_index=1)])
    assert ok.accepted and stale.reason == ReasonCode.STALE_POLICY
    (again,) = client.lease(1).tasks
    assert (again.task_id, list(again.sample_indices)) == (task.task_id, [1])
    assert client.submit([make_traj(again, version=2, sample_index=1)])[0].accepted
    assert len(server.take_batch(2, timeout_s=1)) == 2  # the group completes with the re-run sample


def test_full_buffer_pushes_back_with_retry_hint(tmp_path):
  with running(tmp_path, buffer_capacity=2, backpressure_retry_ms=50) as server:
    channel, stub = stub_for(server)
    tasks = stub.LeaseTasks(sao_pb2.LeaseRequest(worker_id="w", max_tasks=3), timeout=10).tasks
    msgs = [make_traj(t).to_proto() for t in tasks]
    results = submit_raw(stub, msgs)
    assert [r.accepted for r in results] == [True, True, False]
    assert results[2].reason == sao_pb2.REJECT_REASON_BACKPRESSURE and results[2].retry_after_ms == 50
    assert server.stats()["occupancy"] == 2
    batch = server.take_batch(2, timeout_s=1)
    server.mark_consumed(batch, step=1)
    assert submit_raw(stub, msgs[2:])[0].accepted  # room again
    channel.close()


def test_max_outstanding_bounds_leased_plus_buffered(tmp_path):
  with running(tmp_path, max_outstanding=4) as server, TrajectoryClient(f"127.0.0.1:{server.port}") as client:
    tasks = list(client.lease(10).tasks)
    assert len(tasks) == 4  # capped by max_outstanding
    empty = client.lease(1)
    assert not empty.tasks and empty.retry_after_ms > 0
    outcomes = client.submit([make_traj(t) for t in tasks[:2]])
    assert all(o.accepted for o in outcomes)
    assert not client.lease(1).tasks  # submitted ones still count while buffered
    assert len(server.take_batch(2, timeout_s=5)) == 2
    assert len(client.lease(10).tasks) == 2  # consumed: room for two more


def test_group_mode_buffers_whole_groups_and_reserves_their_room(tmp_path):
  cfg = DispenserConfig(mode="group", group_size=3)
  with running(tmp_path, dispenser_config=cfg, buffer_capacity=4) as server, \
      TrajectoryClient(f"127.0.0.1:{server.port}", retry_budget_s=0.2) as client:
    a, b = client.lease(2).tasks
    assert list(a.sample_indices) == [0, 1, 2] and a.num_samples == 3
    assert all(o.accepted for o in client.submit([make_traj(a, 2), make_traj(a, 0)]))
    # Group b cannot reserve its 3 slots (3 reserved for a + 3 > 4): pushed back, kept pending by the client.
    (pushed,) = client.submit([make_traj(b, 0)])
    assert pushed.pending and not pushed.accepted
    assert server.take_batch(3, timeout_s=0.05) == []  # a is not complete yet
    assert client.submit([make_traj(a, 1)])[0].accepted  # a's reserved room: never pushed back
    group = server.take_batch(3, timeout_s=1)
    assert [t.sample_index for t in group] == [0, 1, 2] and {t.group_id for t in group} == {a.group_id}
    server.mark_consumed(group, step=1)
    assert client.flush()[0].accepted  # the pending sample of b goes through now
    with pytest.raises(ValueError, match="multiple of the group size"):
      server.take_batch(4, timeout_s=0)


def test_validation_trajectories_go_to_eval_not_buffer(tmp_path):
  cfg = DispenserConfig(eval_every=2, success_threshold=1.0)
  with running(tmp_path, dispenser_config=cfg, validation_tasks=[{"id": "v0"}, {"id": "v1"}]) as server, \
      TrajectoryClient(f"127.0.0.1:{server.port}") as client:
    server.set_policy_version(2)
    tasks = client.lease(3).tasks
    evals = [t for t in tasks if t.is_validation]
    assert len(evals) == 2 and all(t.temperature == 0.0 for t in evals)
    outcomes = client.submit([make_traj(evals[0], version=2, reward=1.0),
                              make_traj(evals[1], version=2, reward=0.0)])
    assert all(o.accepted for o in outcomes)
    (result,) = server.eval_results()
    assert result.policy_version == 2 and result.success_rate == 0.5
    assert server.stats()["buffered"] == 0 and server.stats()["eval_accepted"] == 2


def test_non_loopback_bind_without_token_refuses_to_start(tmp_path):
  server = TrajectoryServer(ServerConfig(log_dir=str(tmp_path), vocab_size=VOCAB, host="0.0.0.0"),
                            TaskDispenser(TASKS))
  with pytest.raises(ValueError, match="non-loopback host '0.0.0.0' without ServerConfig.token"):
    server.start()
  server.stop()  # a no-op, but teardown must be safe either way


def test_token_is_required_when_configured(tmp_path):
  with running(tmp_path, token="s3cret") as server:
    address = f"127.0.0.1:{server.port}"
    for token in (None, "wrong"):
      # UNAUTHENTICATED is not retried, so a long budget costs nothing; a 1 s one cut the RPC's deadline on a
      # loaded machine (DEADLINE_EXCEEDED instead of the refusal).
      with TrajectoryClient(address, token=token, retry_budget_s=30) as client:
        with pytest.raises(grpc.RpcError) as e:
          client.status()
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as e:
          client.lease(1)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert server.dispenser.num_leased == 0
    with TrajectoryClient(address, token="s3cret") as client:
      assert len(client.lease(1).tasks) == 1 and client.status().leased == 1


def test_client_resends_after_server_restart_without_duplicating(tmp_path):
  with running(tmp_path, buffer_capacity=2, backpressure_retry_ms=20) as server:
    port = server.port
    # A call's retry budget also bounds its RPC's deadline: a short one (the pushed-back pair's 0.2 s) only where
    # the outcome is the same either way, else on a loaded machine the lease, or the submission the server accepted,
    # times out on the client's side (DEADLINE_EXCEEDED, or all four left pending).
    client = TrajectoryClient(f"127.0.0.1:{port}", retry_budget_s=60, initial_backoff_s=0.05)
    tasks = client.lease(4).tasks
    trajs = [make_traj(t) for t in tasks]
    outcomes = client.submit(trajs[:2]) + client.submit(trajs[2:], budget_s=0.2)  # the buffer holds two
    assert [o.accepted for o in outcomes] == [True, True, False, False] and client.num_pending == 2
    assert [o.pending for o in outcomes[2:]] == [True, True]
    state = json.loads(json.dumps(server.dispenser.state_dict()))  # the trainer's checkpoint
  # The server is down now; a new one comes up on the same port from the same log dir while the client retries.
  box = {}

  def restart():
    time.sleep(0.4)
    box["cm"] = running(tmp_path, dispenser_state=state, buffer_capacity=8, port=port)
    box["server"] = box["cm"].__enter__()

  thread = threading.Thread(target=restart)
  thread.start()
  try:
    again = client.submit(trajs[:2])  # re-send of the already-accepted two, plus the two pending
    thread.join(timeout=60)
    server2 = box["server"]
    assert all(o.accepted and o.duplicate for o in again)
    late = client.late_outcomes()
    assert sorted(o.lease_id for o in late) == sorted(t.lease_id for t in tasks[2:])
    assert all(o.accepted and not o.duplicate for o in late) and client.num_pending == 0
    stats = server2.stats()
    assert (stats["accepted"], stats["duplicates"], stats["buffered"]) == (4, 2, 4)
    batch = server2.take_batch(4, timeout_s=1)
    assert sorted(t.lease_id for t in batch) == sorted(t.lease_id for t in tasks)
  finally:
    client.close()
    thread.join(timeout=60)
    if "cm" in box:
      box["cm"].__exit__(None, None, None)


def test_restart_restores_accepted_but_unconsumed(tmp_path):
  cfg = DispenserConfig(mode="group", group_size=2)
  with running(tmp_path, dispenser_config=cfg) as server, \
      TrajectoryClient(f"127.0.0.1:{server.port}", worker_id="w-restart") as client:
    a, b, c = client.lease(3).tasks
    client.submit([make_traj(a, 0), make_traj(a, 1), make_traj(b, 0), make_traj(b, 1), make_traj(c, 0)])
    first = server.take_batch(2, timeout_s=1)
    server.mark_consumed(first, step=1)
    server.take_batch(2, timeout_s=1)  # taken by the learner, which then crashes before consuming it
    state = server.dispenser.state_dict()
  consumed_group = first[0].group_id
  with running(tmp_path, dispenser_config=cfg, dispenser_state=state) as server, \
      TrajectoryClient(f"127.0.0.1:{server.port}", worker_id="w-restart") as client:  # the lease's holder
    stats = server.stats()
    assert (stats["accepted"], stats["consumed"], stats["buffered"]) == (5, 2, 3)
    batch = server.take_batch(2, timeout_s=1)
    assert batch[0].group_id != consumed_group and [t.sample_index for t in batch] == [0, 1]
    assert server.take_batch(2, timeout_s=0.05) == []  # c is half done; its lease survived in the checkpoint
    assert client.submit([make_traj(c, 1)])[0].accepted
    assert [t.task_id for t in server.take_batch(2, timeout_s=1)] == [c.task_id] * 2


def test_load_many_clients_fill_the_buffer_several_times(tmp_path):
  # No wall-clock bound (it failed on a loaded machine, where this takes a minute instead of 3 s); the waits below
  # are generous bounds that only a hang reaches.
  n_clients, per_client, capacity, batch_size = 64, 8, 32, 8
  tasks = [{"id": f"t{i}"} for i in range(n_clients * per_client)]
  with running(tmp_path, tasks=tasks, buffer_capacity=capacity, backpressure_retry_ms=20, max_workers=8) as server:
    address = f"127.0.0.1:{server.port}"
    errors, consumed, stop = [], [], threading.Event()

    def worker(i):
      try:
        # Deadlines only a hang reaches: an RPC timed out after the server stored it would be re-sent, a duplicate.
        with TrajectoryClient(address, worker_id=f"w{i}", retry_budget_s=300, rpc_timeout_s=300) as client:
          leased = client.lease(per_client).tasks
          for j in range(0, len(leased), 4):
            outcomes = client.submit([make_traj(t) for t in leased[j:j + 4]])
            if not all(o.accepted for o in outcomes):
              errors.append((i, outcomes))
      except Exception as e:  # reported by the main thread's assertion
        errors.append((i, repr(e)))

    def consumer():
      step = 0
      while not stop.is_set() and step < 10_000:
        batch = server.take_batch(batch_size, timeout_s=0.1)
        if batch:
          step += 1
          server.mark_consumed(batch, step)
          consumed.extend(batch)
          time.sleep(0.02)  # a learner step: slower than 64 workers, so the buffer fills and pushes back

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_clients)]
    consumer_thread = threading.Thread(target=consumer)
    consumer_thread.start()
    for t in threads:
      t.start()
    for t in threads:
      t.join(timeout=300)
    stop.set()
    consumer_thread.join(timeout=60)
    assert not any(t.is_alive() for t in threads + [consumer_thread]), "a client or the consumer hangs"
    assert not errors, errors[:3]
    stats = server.stats()
    assert stats["accepted"] == n_clients * per_client
    assert stats["accepted"] == stats["consumed"] + stats["buffered"] and stats["in_learner"] == 0
    assert stats["max_occupancy"] <= capacity and stats["duplicates"] == 0
    assert len({(t.lease_id, t.sample_index) for t in consumed}) == len(consumed) == stats["consumed"]
    assert stats["consumed"] >= 3 * capacity  # the buffer was filled and drained several times
    assert stats["rejected_by_reason"].get("BACKPRESSURE", 0) > 0


def test_tls_with_token(tmp_path):
  """TLS from config paths: a client trusting the certificate gets through; a plaintext one does not."""
  if shutil.which("openssl") is None:
    pytest.skip("openssl CLI not available to make a test certificate")
  cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
  subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                  "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                  "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True,
                 timeout=30)
  with running(tmp_path, token="s3cret", tls_cert_path=str(cert), tls_key_path=str(key)) as server:
    address = f"127.0.0.1:{server.port}"
    with TrajectoryClient(address, token="s3cret", tls_root_cert=str(cert)) as client:
      assert len(client.lease(1).tasks) == 1
    # One attempt (a backoff beyond the budget: no retry) with a deadline a loaded machine meets: the handshake's
    # failure must come back as UNAVAILABLE, not the RPC's deadline running out first (a 0.3 s budget did).
    with TrajectoryClient(address, token="s3cret", retry_budget_s=30, initial_backoff_s=60) as plaintext:
      with pytest.raises(grpc.RpcError) as e:
        plaintext.status()
      assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_submission_sent_at_the_end_of_its_budget_is_not_timed_out_after_the_server_stored_it(tmp_path,
                                                                                                 monkeypatch):
  # The server takes 0.2 s per submission (a loaded machine); the call's budget is 0.05 s. The RPC's deadline used
  # to be what was left of the budget: it timed out after the server had stored the trajectory, which then stayed
  # pending in the client and came back as a duplicate when re-sent.
  slow_seconds = 0.2
  original = TrajectoryServer.SubmitTrajectories

  def slow_submit(self, request, context):
    time.sleep(slow_seconds)
    return original(self, request, context)

  monkeypatch.setattr(TrajectoryServer, "SubmitTrajectories", slow_submit)
  with running(tmp_path) as server, TrajectoryClient(f"127.0.0.1:{server.port}") as client:
    (task,) = client.lease(1).tasks
    (outcome,) = client.submit([make_traj(task)], budget_s=0.05)
    assert outcome.accepted and not outcome.pending and not outcome.duplicate
    assert client.num_pending == 0 and client.flush() == []
    assert server.stats()["duplicates"] == 0
    assert client.min_rpc_timeout_s >= 5 * slow_seconds  # the margin this test relies on


def test_min_rpc_timeout_must_lie_within_the_rpc_timeout():
  with pytest.raises(ValueError, match="min_rpc_timeout_s must lie in"):
    TrajectoryClient("127.0.0.1:1", rpc_timeout_s=1.0, min_rpc_timeout_s=2.0)
