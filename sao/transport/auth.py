"""Who may call the trainer's gRPC service: a shared-secret bearer token, and the rule for binding without one.

Workers send `authorization: Bearer <token>` metadata on every call (`sao.transport.client`); the server's
`TokenInterceptor` rejects any other call with UNAUTHENTICATED. Binding a non-loopback address without a token is
refused (`TrajectoryServer.start`): on loopback only processes of this machine can connect.
"""
from __future__ import annotations

import hmac
import ipaddress

import grpc

AUTH_METADATA_KEY = "authorization"


def is_loopback(host: str) -> bool:
  """Whether `host` ("localhost", an IPv4/IPv6 literal, optionally bracketed) names the loopback interface."""
  if host == "localhost":
    return True
  try:
    return ipaddress.ip_address(host.strip("[]")).is_loopback
  except ValueError:
    return False


class TokenInterceptor(grpc.ServerInterceptor):
  """Rejects every call whose `authorization` metadata is not `Bearer <token>` with UNAUTHENTICATED."""

  def __init__(self, token: str):
    self._expected = f"Bearer {token}".encode()

    def deny(request, context):
      context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong shared-secret token (authorization metadata)")

    self._deny = grpc.unary_unary_rpc_method_handler(deny)

  def intercept_service(self, continuation, handler_call_details):
    sent = dict(handler_call_details.invocation_metadata or ()).get(AUTH_METADATA_KEY, "")
    if isinstance(sent, str) and hmac.compare_digest(sent.encode(), self._expected):
      return continuation(handler_call_details)
    return self._deny
