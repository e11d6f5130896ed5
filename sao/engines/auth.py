"""Shared-secret auth for the HTTP servers of this package (the local engine) and above it (the token-capturing
proxy): the same rule the gRPC trajectory service follows.

Rule: a server bound to a loopback interface may run without a token (only processes on the machine reach it); a
server bound to any other interface refuses to start without one (`require_token_for_bind`). When a token is set,
every request must carry `Authorization: Bearer <token>` (compared in constant time) or gets 401; only
`exempt_paths` (the engine's `/health`, as in SGLang, so a launcher can poll liveness) are answered without it.
The token travels in clear text over HTTP: across machines, use a trusted network or a TLS-terminating proxy.
"""
from __future__ import annotations

import hmac
import os
from typing import Awaitable, Callable, Iterable

from aiohttp import web

from sao.transport.auth import is_loopback  # one rule for every server: 127.0.0.0/8, ::1, localhost

# Environment variable both `python -m sao.engines.serve` and `SGLangEngine` read when no token is passed (so the
# secret need not appear on a command line).
API_KEY_ENV = "SAO_ENGINE_API_KEY"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ErrorResponse = Callable[[int, str], web.StreamResponse]


def require_token_for_bind(host: str, token: str | None, what: str) -> None:
  """Raises ValueError if `what` would bind the non-loopback `host` without a token."""
  if not is_loopback(host) and not token:
    raise ValueError(f"{what}: refusing to bind non-loopback host {host!r} without a token (set --api_key or "
                     f"${API_KEY_ENV}); without one, bind 127.0.0.1")


def bearer_middleware(token: str, error: ErrorResponse, exempt_paths: Iterable[str] = ()) -> Callable:
  """aiohttp middleware answering `error(401, message)` to any request (outside `exempt_paths`) whose
  `Authorization` header is not `Bearer <token>`."""
  if not token:
    raise ValueError("bearer_middleware: empty token")
  expected = f"Bearer {token}".encode()
  exempt = frozenset(exempt_paths)

  @web.middleware
  async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path not in exempt:
      sent = request.headers.get("Authorization", "").encode()
      if not hmac.compare_digest(sent, expected):
        return error(401, "missing or wrong token (send 'Authorization: Bearer <token>')")
    return await handler(request)

  return check


def token_from_env(token: str | None) -> str | None:
  """`token` if given, else `$SAO_ENGINE_API_KEY` (None when neither is set or it is empty)."""
  if token:
    return token
  return os.environ.get(API_KEY_ENV) or None
