"""The rollout worker's heartbeats go at a fixed rate: the heartbeat RPC's own time does not stretch the gap to the
next one (which used to be the period + the RPC's time), and a heartbeat slower than a period skips the ticks it
missed instead of sending them in a burst. Driven by a fake clock: no test time depends on the machine's speed."""
import asyncio
import types

import grpc
import pytest

from sao.models.tokenizer import toy_tokenizer
from sao.rollout.worker import RolloutWorker, WorkerConfig, next_heartbeat

PERIOD_S = 0.25  # binary fractions: the expected times are exact


class _Stopped(grpc.RpcError):

  def code(self):
    return grpc.StatusCode.CANCELLED


def _heartbeat_times(rpc_s: float, count: int) -> list[float]:
  """The fake-clock times at which the worker's first `count` heartbeats start, each RPC taking `rpc_s`."""
  now = [0.0]
  worker = RolloutWorker(WorkerConfig(trainer_address="127.0.0.1:1", heartbeat_interval_s=PERIOD_S),
                         toy_tokenizer())
  worker._clock = lambda: now[0]  # pylint: disable=protected-access

  async def wait_until(deadline):  # the fake clock jumps to the deadline
    now[0] = max(now[0], deadline)
    await asyncio.sleep(0)

  worker._wait_until = wait_until  # pylint: disable=protected-access
  worker._lease_ttl_s = 30.0  # pylint: disable=protected-access  (period = min(interval, TTL / 3) = PERIOD_S)
  worker._running = {"lease-0": 1}  # pylint: disable=protected-access
  started: list[float] = []

  def heartbeat(lease_ids):
    assert lease_ids == ["lease-0"]
    started.append(now[0])
    now[0] += rpc_s
    if len(started) == count:  # the loop's exit while stopping: a cancelled RPC
      worker.stop()
      raise _Stopped()
    return types.SimpleNamespace(expired_lease_ids=[])

  worker.client.heartbeat = heartbeat
  try:
    asyncio.run(asyncio.wait_for(worker._heartbeat_loop(), timeout=60))  # pylint: disable=protected-access
  finally:
    worker.client.close()
  return started


def test_heartbeat_gap_does_not_grow_by_the_rpc_time():
  # Each RPC takes half a period: the old schedule (period after the last RPC ended) started them at 0.25, 0.625,
  # 1.0, ... (gap 0.375).
  assert _heartbeat_times(rpc_s=PERIOD_S / 2, count=6) == [PERIOD_S * k for k in range(1, 7)]


def test_a_heartbeat_slower_than_a_period_skips_missed_ticks_without_a_burst():
  # 1.5 periods per RPC: the tick due during it is skipped; the next heartbeat goes at the following tick.
  assert _heartbeat_times(rpc_s=1.5 * PERIOD_S, count=4) == [0.25, 0.75, 1.25, 1.75]


@pytest.mark.parametrize("previous, now, expected", [
    (1.0, 1.0, 1.25),  # on time: one period later
    (1.0, 1.1, 1.25),  # the RPC took part of the period: still the grid's next tick
    (1.0, 1.25, 1.25),  # exactly due: now
    (1.0, 1.3, 1.5),  # one tick missed: skipped
    (1.0, 2.1, 2.25),  # several missed: the first tick ahead, not a burst of them
])
def test_next_heartbeat_keeps_the_grid(previous, now, expected):
  assert next_heartbeat(previous, PERIOD_S, now) == expected
