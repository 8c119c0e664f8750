"""The ASGI vocabulary and the scope keys Bastion adds; nothing else redefines them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

__all__ = [
    "H2_PROTOCOL_FACTORY",
    "RESPONSE_START",
    "SCOPE_API_VERSION",
    "SCOPE_CLAIMS",
    "SCOPE_CLIENT_CERTIFICATE",
    "SCOPE_DEFERRED_REVOCATION",
    "SCOPE_GRPC_RESOURCE",
    "SCOPE_REQUEST_ID",
    "SCOPE_RESPONSE_HEADERS",
    "SCOPE_ROUTE",
    "ASGIApp",
    "Headers",
    "Message",
    "Receive",
    "Scope",
    "Send",
]

RESPONSE_START = {"http": "http.response.start", "websocket": "websocket.http.response.start"}
"""The message that starts a response (with its headers), by scope type: a WebSocket handshake that is refused
before ``websocket.accept`` answers with an ordinary HTTP response (ASGI's ``websocket.http.response``)."""

SCOPE_REQUEST_ID = "bastion.request_id"
"""str: the request id, kept from ``x-request-id`` or generated (request_id middleware)."""
SCOPE_RESPONSE_HEADERS = "bastion.response_headers"
"""Headers: headers every response of this request carries, errors included (deprecation)."""
SCOPE_ROUTE = "bastion.route"
"""routing._resolve.ResolvedRoute | None: the route the request reaches, resolved before auth."""
SCOPE_API_VERSION = "bastion.api_version"
"""int: the API major version of a versioned request."""
SCOPE_GRPC_RESOURCE = "bastion.grpc_resource"
"""Mapping: a gRPC call's resource attributes, from its method's resource extractor (policy reads them)."""
SCOPE_CLAIMS = "bastion.claims"
"""bastion.Claims: the verified token claims (token auth)."""
SCOPE_CLIENT_CERTIFICATE = "bastion.client_certificate"
"""bastion._tls.ClientCertificate | None: the verified client certificate of the connection (mutual TLS; the
HTTP/1.1 protocol and the gRPC guard write it once per request or call, when ``tls.client_auth`` is on)."""
SCOPE_DEFERRED_REVOCATION = "bastion.deferred_revocation"
"""_cache_store.DeferredRevocation: the revocation check token auth left to the distributed limiter, which makes
it in the same round trip as the charge (taken out of the scope by the rate-limit step)."""
H2_PROTOCOL_FACTORY = "bastion.h2_protocol_factory"
"""Key in the ASGI lifespan state: the callable the listener's sniffer hands HTTP/2 connections to (gRPC)."""


class ReadAhead:
    """The owner of a ``receive`` (the bound method's ``__self__``) that has read the request's whole body already:
    the idempotency step, which needs the body before the handler runs. A handler given such a ``receive`` may take
    the body with :meth:`take_body` instead of receiving it a second time (Bastion's compiled handlers do; anything
    else just calls ``receive``, which hands the body over as it came)."""

    __slots__ = ()

    def take_body(self) -> bytes | None:
        """The whole body, taken: from now on ``receive`` waits on the client. ``None`` once it was received."""
        raise NotImplementedError
