"""sao.train.coordination: messages reach every process in order, a process that stops beating or reports a failure
is named, and a real 2-process job (the JAX coordination service) does both."""
from __future__ import annotations

import threading
import time

import pytest

from sao.train import coordination
from tests import multihost
from tests.train import helpers


class FakeClient:
  """The `jax.distributed` client's key-value calls, in memory, shared by the channels of one test's processes."""

  def __init__(self):
    self.store: dict[str, bytes | str] = {}
    self.cond = threading.Condition()

  def key_value_set(self, key, value, allow_overwrite=False):
    with self.cond:
      if key in self.store and not allow_overwrite:
        raise RuntimeError(f"ALREADY_EXISTS: {key}")
      self.store[key] = value
      self.cond.notify_all()

  key_value_set_bytes = key_value_set

  def blocking_key_value_get_bytes(self, key, timeout_in_ms):
    with self.cond:
      if not self.cond.wait_for(lambda: key in self.store, timeout_in_ms / 1000):
        raise RuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out with key: {key}")
      return self.store[key]

  def key_value_dir_get(self, prefix):
    with self.cond:
      return [(k, v) for k, v in sorted(self.store.items()) if k.startswith(prefix)]

  def key_value_delete(self, key):
    with self.cond:
      self.store.pop(key, None)


def _channels(n=2, **kw):
  client = FakeClient()
  kw = {"heartbeat_timeout_s": 0.6, "heartbeat_interval_s": 0.05, "exit_grace_s": 120.0, **kw}
  return client, [coordination.KeyValueChannel(client, i, n, **kw) for i in range(n)]


def test_message_round_trip_keeps_trajectories_and_data():
  trajectories = helpers.trajectories(seed=3, n=4)
  message = coordination.Message("batch", {"step": 7, "extra": {"a": [1, 2]}}, trajectories)
  again = coordination.decode(coordination.encode(message))
  assert again.tag == "batch" and again.data == {"step": 7, "extra": {"a": [1, 2]}}
  assert again.trajectories == trajectories
  with pytest.raises(ValueError, match="truncated"):
    coordination.decode(coordination.encode(message)[:-5])


def test_every_process_receives_every_message_in_order_and_read_ones_are_deleted():
  client, (p0, p1, p2) = _channels(3)
  try:
    received = {1: [], 2: []}

    def follow(channel):
      for n in range(20):
        received[channel.process_id].append(channel.share("m").data)

    threads = [threading.Thread(target=follow, args=(c,)) for c in (p1, p2)]
    for t in threads:
      t.start()
    sent = [p0.share("m", n).data for n in range(20)]
    for t in threads:
      t.join(timeout=30)
    assert sent == received[1] == received[2] == list(range(20))
    p0.share("m", 20)  # sending deletes what both followers acknowledged: the first 20
    key = p0._msg_key(20)  # pylint: disable=protected-access
    assert sorted(k for k in client.store if "/msg/" in k) == [key, key + ".0"]
  finally:
    for c in (p0, p1, p2):
      c.close()


def test_a_message_larger_than_a_piece_arrives_whole(monkeypatch):
  monkeypatch.setattr(coordination, "CHUNK_BYTES", 100)
  trajectories = helpers.trajectories(seed=5, n=6)
  client, (p0, p1) = _channels()
  try:
    p0.share("batch", {"step": 1}, trajectories)
    assert int(client.store[p0._msg_key(0)]) > 3  # pylint: disable=protected-access
    assert p1.share("batch").trajectories == trajectories
  finally:
    p0.close()
    p1.close()


def test_a_message_of_another_kind_is_a_divergence():
  _, (p0, p1) = _channels()
  try:
    p0.share("stop", {"why": "done"})
    with pytest.raises(coordination.Diverged, match="expected a 'batch' message.*'stop'"):
      p1.share("batch")
  finally:
    p0.close()
    p1.close()


def test_a_silent_process_is_named_by_the_others():
  _, (p0, p1, p2) = _channels(3)
  try:
    p2.close()  # its watchdog stops beating: killed, frozen, or its host gone
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
      try:
        p0.check()
      except coordination.ProcessLost as e:
        assert e.process_id == 2 and "process 2 of the trainer job is lost: no heartbeat" in str(e)
        break
      time.sleep(0.05)
    else:
      pytest.fail("process 0 never declared process 2 lost")
    # A follower waiting for a message raises too, rather than waiting forever.
    with pytest.raises(coordination.ProcessLost, match="process 2"):
      p1.share("batch")
  finally:
    p0.close()
    p1.close()


def _in_threads(channels, fn):
  """`fn(channel)` on every channel at once (each a process); returns the results or the exceptions, in order."""
  results = [None] * len(channels)

  def run(i):
    try:
      results[i] = fn(channels[i])
    except Exception as e:  # noqa: BLE001 — returned to the test
      results[i] = e

  threads = [threading.Thread(target=run, args=(i,)) for i in range(len(channels))]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=30)
  return results


def test_equal_plans_agree_and_any_process_flag_reaches_all():
  client, channels = _channels(3)
  try:
    for round_ in range(4):  # rounds two behind are deleted
      out = _in_threads(channels, lambda c, r=round_: c.agree("update", {"groups": [[8, 64]], "n": r},
                                                               {"stop": c.process_id == 2 and r == 3}))
      assert out == [{"stop": round_ == 3}] * 3
    assert sorted(k.split("/agree/")[1] for k in client.store if "/agree/" in k) == [
        f"{n:012d}/{i}" for n in (2, 3) for i in range(3)]
  finally:
    for c in channels:
      c.close()


def test_different_plans_stop_every_process_with_both_plans_named():
  _, channels = _channels(2)
  try:
    plans = [{"update": 3, "groups": [[8, 64], [8, 128]]}, {"update": 3, "groups": [[8, 64]]}]
    out = _in_threads(channels, lambda c: c.agree("update", plans[c.process_id]))
    for e in out:
      assert isinstance(e, coordination.Diverged), e
      assert "differing: groups" in str(e) and "[[8, 64], [8, 128]]" in str(e) and "process 1 plans" in str(e)
    # Two processes at different points (another tag) are a divergence too.
    out = _in_threads(channels, lambda c: c.agree("update" if c.process_id == 0 else "checkpoint", {}))
    assert all(isinstance(e, coordination.Diverged) and "different points" in str(e) for e in out)
  finally:
    for c in channels:
      c.close()


def test_a_process_stuck_in_a_phase_past_its_bound_stalls_the_job_naming_every_phase():
  _, (p0, p1) = _channels(2, heartbeat_timeout_s=60.0, stall_compile_budget_s=0.4, stall_step_factor=2.0)
  try:
    with p0.busy("rl step 0: update"):  # a finished phase sets the bound: 0.4 + 2 × its length
      time.sleep(0.05)
    assert "after rl step 0" in p0.phase()
    with p1.busy("rl step 1: update"):  # process 1 stuck in a collective
      deadline = time.monotonic() + 30
      while time.monotonic() < deadline:
        try:
          p0.check()
        except coordination.Stalled as e:
          assert e.process_id == 1
          assert "process 1: rl step 1: update for" in str(e) and "process 0: between phases" in str(e)
          break
        time.sleep(0.05)
      else:
        pytest.fail("the stall was never declared")
      with pytest.raises(coordination.Stalled):
        p1.check()  # the stuck process's own watchdog says so too
  finally:
    p0.close()
    p1.close()


def test_a_long_phase_within_its_bound_is_no_stall():
  _, (p0, p1) = _channels(2, heartbeat_timeout_s=60.0, stall_compile_budget_s=2.0)
  try:
    with p1.busy("value_pretrain step 0: update (compiling)"):
      time.sleep(0.8)
    p0.check()
    p1.check()
  finally:
    p0.close()
    p1.close()


def test_a_reported_failure_reaches_process_0_with_its_reason():
  _, (p0, p1) = _channels(heartbeat_timeout_s=60.0)
  try:
    p1.report_failure("ValueError: bad batch")
    with pytest.raises(coordination.ProcessLost, match="process 1 .* stopped with an error: ValueError: bad batch"):
      deadline = time.monotonic() + 30
      while time.monotonic() < deadline:
        p0.check()
        time.sleep(0.05)
    # A collective's own error becomes the loss that caused it.
    assert isinstance(p0.explain(RuntimeError("gloo: connection reset")), coordination.ProcessLost)
  finally:
    p0.close()
    p1.close()


def test_explain_returns_the_error_when_no_process_is_lost():
  _, (p0, p1) = _channels()
  try:
    error = RuntimeError("a real bug")
    assert p0.explain(error, wait_s=0.2) is error
  finally:
    p0.close()
    p1.close()


def test_bad_arguments_are_named():
  with pytest.raises(ValueError, match="process_id 2 is outside"):
    coordination.KeyValueChannel(FakeClient(), 2, 2)
  with pytest.raises(ValueError, match="must exceed two heartbeat intervals"):
    coordination.KeyValueChannel(FakeClient(), 0, 2, heartbeat_timeout_s=1.0, heartbeat_interval_s=1.0)


def test_two_jax_processes_share_messages_and_name_a_frozen_process():
  """The real transport: 2 CPU JAX processes; process 1 freezes (SIGSTOP) after the messages."""
  results = multihost.run_processes("tests/train/multihost_coordination_worker.py", num_processes=2,
                                    devices_per_process=1, args=["--hang"], timeout_s=240, check=False)
  received = [next(line for line in r.output.splitlines() if line.startswith("RECEIVED ")) for r in results]
  assert received[0] == received[1], received
  assert '["m2", {"n": 2}' in received[1] and "[true, true, true]" in received[1]
  assert results[0].returncode == coordination.EXIT_PROCESS_LOST, results[0].output[-3000:]
  assert "LOST after" in results[0].output and "process 1 of the trainer job is lost: no heartbeat" in \
      results[0].output


def test_two_jax_processes_with_different_plans_stop_with_both_named():
  """The real transport: the processes agree on one plan (a stop flag of process 1's reaches process 0), then each
  plans a different update: both raise `Diverged` naming both plans instead of running different programs."""
  results = multihost.run_processes("tests/train/multihost_coordination_worker.py", num_processes=2,
                                    devices_per_process=1, args=["--diverge"], timeout_s=240)
  for r in results:
    assert 'AGREED {"stop": true}' in r.output, r.output[-3000:]
    line = next(x for x in r.output.splitlines() if x.startswith("DIVERGED "))
    assert "differing: groups" in line and '"groups": [[8, 64]]' in line and '"groups": [[8, 64], [8, 64]]' in line
