"""A lease that lapses while its submission is being written is neither re-leased nor accepted twice.

Before: `_submit` checked the lease, wrote the log, then completed the lease; a LeaseTasks call in that window
expired and re-leased the sample, the copy was accepted again, and its group reservation was never closed: with
capacity 3 the leaked slots soon refused every new group with BACKPRESSURE. The interleaving is reproduced here
deterministically: an injected clock, and a hook inside the log write that lets the lease lapse and asks for work.
"""
from sao.transport import sao_pb2
from sao.transport.dispenser import DispenserConfig, TaskDispenser
from sao.transport.server import ServerConfig, TrajectoryServer
from sao.transport.trajectory import ReasonCode, Trajectory

from tests.transport.helpers import TASKS, VOCAB, make_traj
from tests.transport.test_dispenser import FakeClock, traj_for
from tests.transport.test_dispenser import TASKS as TEN_TASKS


def test_dispenser_holds_a_lease_while_its_submission_is_in_flight():
  clock = FakeClock()
  d = TaskDispenser(TEN_TASKS, DispenserConfig(lease_ttl_s=10, num_epochs=1), clock=clock)
  (lease,) = d.lease("a", 1)
  traj = traj_for(lease)
  held = d.begin_submission(traj, "a")
  clock.now += 11  # past the TTL while the record is being written
  assert lease.task_id not in [l.task_id for l in d.lease("b", 100)]  # not re-leased meanwhile
  assert d.complete(held, traj) and d.num_leased == 10 - 1  # 9 fresh leases to b; a's is finished


def test_an_aborted_submission_releases_the_hold_and_the_lapsed_lease_is_re_leased():
  clock = FakeClock()
  d = TaskDispenser(TEN_TASKS, DispenserConfig(lease_ttl_s=10, num_epochs=1), clock=clock)
  (lease,) = d.lease("a", 1)
  traj = traj_for(lease)
  held = d.begin_submission(traj, "a")
  clock.now += 11
  d.abort_submission(held, traj)  # e.g. the log write failed: nothing was stored
  (again,) = d.lease("b", 1)  # re-leases come first
  assert again.task_id == lease.task_id and again.lease_id != lease.lease_id


def test_lease_expiring_during_its_log_write_is_accepted_once_and_leaks_no_buffer_slot(tmp_path):
  clock = FakeClock()
  dispenser = TaskDispenser(TASKS, DispenserConfig(lease_ttl_s=10), clock=clock)
  server = TrajectoryServer(ServerConfig(log_dir=str(tmp_path), vocab_size=VOCAB, buffer_capacity=3), dispenser)
  server.start()
  try:
    real_append = server._log.append_batch  # pylint: disable=protected-access
    raced: list[sao_pb2.LeasedTask] = []

    def append_while_the_lease_lapses(trajs: list[Trajectory]) -> None:
      if trajs and trajs[0].lease_id == racing["lease_id"]:
        clock.now += 11  # the lease lapses between the lease check and the log write ...
        raced.extend(server.LeaseTasks(sao_pb2.LeaseRequest(worker_id="b", max_tasks=1), None).tasks)
      real_append(trajs)  # ... and another worker asks for work meanwhile

    server._log.append_batch = append_while_the_lease_lapses  # pylint: disable=protected-access
    racing = {"lease_id": ""}
    for round_ in range(6):  # twice the capacity: leaked slots would have exhausted it
      (task,) = server.LeaseTasks(sao_pb2.LeaseRequest(worker_id="a", max_tasks=1), None).tasks
      racing["lease_id"] = task.lease_id
      request = sao_pb2.SubmitRequest(worker_id="a", trajectories=[make_traj(task).to_proto()])
      (result,) = server.SubmitTrajectories(request, None).results
      assert result.accepted, (round_, result)
      for other in raced:  # whatever b was leased, b runs and submits, as a real worker would
        assert other.task_id != task.task_id, f"round {round_}: the in-flight sample was re-leased"
        request = sao_pb2.SubmitRequest(worker_id="b", trajectories=[make_traj(other).to_proto()])
        (late,) = server.SubmitTrajectories(request, None).results
        assert late.accepted or late.reason == ReasonCode.UNKNOWN_LEASE, late  # b's own lease lapsed too
      raced.clear()
      batch = server.take_batch(server.stats()["buffered"], timeout_s=1)
      server.mark_consumed(batch, step=round_)
      assert server.stats()["occupancy"] == 0, f"round {round_}: a reserved slot leaked"
    stats = server.stats()
    assert stats["rejected_by_reason"].get("BACKPRESSURE", 0) == 0
    assert stats["accepted"] == stats["consumed"]
  finally:
    server.stop(grace_s=0.1)
