"""A reconnect in one thread must not cancel the calls other threads have in flight on the shared client.

The rollout worker shares one `TrajectoryClient` between its lease, heartbeat and submit threads; a transient error
in one of them replaces the channel. Closing the old channel at once cancelled the others' calls (CANCELLED, not
retried), which could end the heartbeat loop. Fake channels record when they are closed.
"""
import threading

import grpc
import pytest

from sao.transport import client as client_lib


class _Unavailable(grpc.RpcError):

  def code(self):
    return grpc.StatusCode.UNAVAILABLE

  def details(self):
    return "injected"


class FakeChannel:
  """Answers every unary call with `handler(path)`; records `close()`."""

  def __init__(self, handler):
    self.handler = handler
    self.closed = False

  def unary_unary(self, path, *args, **kwargs):
    del args, kwargs

    def call(request, timeout=None, metadata=None):
      del request, timeout, metadata
      if self.closed:
        raise AssertionError(f"{path} called on a closed channel")
      return self.handler(path, self)
    return call

  def close(self):
    self.closed = True


def _client_on_fake_channels(monkeypatch, handler, channels: list) -> client_lib.TrajectoryClient:
  """A client whose every (re)connect appends a `FakeChannel(handler)` to `channels`."""

  def new_channel(self):
    del self
    channels.append(FakeChannel(handler))
    return channels[-1]

  monkeypatch.setattr(client_lib.TrajectoryClient, "_new_channel", new_channel)
  return client_lib.TrajectoryClient("fake:0", initial_backoff_s=0.001, max_backoff_s=0.001)


def test_reconnect_keeps_other_calls_channel_open_until_they_return(monkeypatch):
  release_heartbeat = threading.Event()
  heartbeat_started = threading.Event()
  channels = []

  def handler(path, channel):
    if path.endswith("Heartbeat"):
      heartbeat_started.set()
      assert release_heartbeat.wait(30)
      assert not channel.closed, "the heartbeat's channel was closed under it"
      return "heartbeat ok"
    if channel is channels[0]:
      raise _Unavailable()  # the lease on the first channel fails transiently: the client reconnects
    return "lease ok"

  client = _client_on_fake_channels(monkeypatch, handler, channels)
  results = {}
  heartbeat = threading.Thread(target=lambda: results.update(hb=client.heartbeat(["l1"])))
  heartbeat.start()
  assert heartbeat_started.wait(30)
  assert client.lease(1) == "lease ok"  # reconnected: a second channel
  assert len(channels) == 2 and not channels[0].closed  # the heartbeat is still in flight on the first
  release_heartbeat.set()
  heartbeat.join(30)
  assert results["hb"] == "heartbeat ok"
  assert channels[0].closed and not channels[1].closed  # closed once its last call returned
  client.close()
  assert channels[1].closed
  with pytest.raises(RuntimeError, match="closed"):
    client.lease(1)


def test_concurrent_failures_reconnect_once(monkeypatch):
  """Two threads failing on the same channel replace it once, not twice (the second sees it already replaced)."""
  both_failed = threading.Barrier(2, timeout=30)
  channels = []

  def handler(path, channel):
    del path
    if channel is channels[0]:
      both_failed.wait()
      raise _Unavailable()
    return "ok"

  client = _client_on_fake_channels(monkeypatch, handler, channels)
  out = []
  threads = [threading.Thread(target=lambda: out.append(client.lease(1))) for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(30)
  assert out == ["ok", "ok"]
  assert len(channels) == 2 and channels[0].closed
  client.close()
