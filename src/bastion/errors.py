"""The error tree and its HTTP rendering.

::

    BastionError                      500 INTERNAL_ERROR
    ├── BadRequest                    400 BAD_REQUEST
    │   ├── MalformedBody             400 MALFORMED_BODY
    │   ├── JsonTooDeep               400 JSON_TOO_DEEP
    │   ├── IdempotencyKeyMissing     400 IDEMPOTENCY_KEY_MISSING
    │   └── IdempotencyKeyInvalid     400 IDEMPOTENCY_KEY_INVALID
    ├── TokenError                    401 UNAUTHORIZED
    │   ├── InvalidToken              401 INVALID_TOKEN
    │   ├── TokenExpired              401 TOKEN_EXPIRED
    │   ├── TokenRevoked              401 TOKEN_REVOKED
    │   ├── ClientCertificateRequired 401 CLIENT_CERTIFICATE_REQUIRED (a path that accepts mtls, none sent)
    │   └── ClientCertificateMismatch 401 CLIENT_CERTIFICATE_MISMATCH (mtls_and_bearer: client_id differs)
    ├── PolicyDenied                  403 FORBIDDEN
    ├── NotFound                      404 NOT_FOUND
    ├── MethodNotAllowed              405 METHOD_NOT_ALLOWED
    ├── RequestTimeout                408 REQUEST_TIMEOUT (the body did not arrive in time)
    ├── IdempotencyConflict           409 IDEMPOTENCY_CONFLICT (the first request with the key still runs)
    ├── Gone                          410 GONE (a sunset API version)
    ├── PayloadTooLarge               413 PAYLOAD_TOO_LARGE
    ├── UnsupportedMediaType          415 UNSUPPORTED_MEDIA_TYPE
    ├── HeadersTooLarge               431 HEADERS_TOO_LARGE (written by the listener itself)
    ├── ValidationFailed              422 VALIDATION_ERROR
    ├── IdempotencyKeyReused          422 IDEMPOTENCY_KEY_REUSED (the key came with another request)
    ├── RateLimitExceeded             429 RATE_LIMIT_EXCEEDED (+ retry_after)
    ├── PolicyError                   500 POLICY_ERROR
    ├── TransferCodingNotImplemented  501 NOT_IMPLEMENTED (written by the listener itself)
    ├── CacheStoreError               500 CACHE_STORE_ERROR
    ├── Unavailable                   503 SERVICE_UNAVAILABLE
    │   ├── CircuitOpen
    │   ├── BulkheadFull
    │   ├── NotReady
    │   ├── IdempotencyUnavailable    503 IDEMPOTENCY_UNAVAILABLE
    │   ├── BrokerUnavailable         503 BROKER_UNAVAILABLE
    │   └── NoResponders              503 NO_RESPONDERS
    ├── BrokerRequestFailed           502 BROKER_REQUEST_FAILED
    └── GatewayTimeout                504 GATEWAY_TIMEOUT
        └── BrokerTimeout             504 BROKER_TIMEOUT

``ConfigError`` (``bastion_core.ConfigError``, a ``ValueError``) stands apart: it is raised only while the
service starts, never rendered to a client. Handlers and middleware raise the others; :func:`render` turns
any of them into the one JSON body ``{"error", "code", "status"[, "retry_after"]}`` (the error-rendering
middleware translates FastAPI's and Starlette's own request errors first). No FastAPI import here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from bastion._responses import JSON_CONTENT_TYPE, json_body
from bastion.types import Headers
from bastion_core import ConfigError

__all__ = [
    "BadRequest",
    "BastionError",
    "BrokerRequestFailed",
    "BrokerTimeout",
    "BrokerUnavailable",
    "BulkheadFull",
    "CacheStoreError",
    "CircuitOpen",
    "ClientCertificateMismatch",
    "ClientCertificateRequired",
    "ConfigError",
    "GatewayTimeout",
    "Gone",
    "HeadersTooLarge",
    "IdempotencyConflict",
    "IdempotencyKeyInvalid",
    "IdempotencyKeyMissing",
    "IdempotencyKeyReused",
    "IdempotencyUnavailable",
    "InvalidToken",
    "JsonTooDeep",
    "MalformedBody",
    "MethodNotAllowed",
    "NoResponders",
    "NotFound",
    "NotReady",
    "PayloadTooLarge",
    "PolicyDenied",
    "PolicyError",
    "RateLimitExceeded",
    "RequestTimeout",
    "TokenError",
    "TokenExpired",
    "TokenRevoked",
    "TransferCodingNotImplemented",
    "Unavailable",
    "UnsupportedMediaType",
    "ValidationFailed",
    "render",
]


class BastionError(Exception):
    """Base of every error Bastion renders; unexpected exceptions render as this one."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "INTERNAL_ERROR"
    message: ClassVar[str] = "Internal server error"
    grpc_status: ClassVar[str] = "INTERNAL"

    def __init__(self, message: str | None = None, *, headers: Sequence[tuple[str, str]] = ()) -> None:
        self.detail = message if message is not None else self.message
        self.headers = list(headers)
        super().__init__(self.detail)

    def body(self) -> dict[str, Any]:
        """The JSON body of this error."""
        return {"error": self.detail, "code": self.code, "status": self.status}


class BadRequest(BastionError):
    """The request cannot be understood."""

    status, code, message, grpc_status = 400, "BAD_REQUEST", "Bad request", "INVALID_ARGUMENT"


class MalformedBody(BadRequest):
    """The body is not valid JSON (or not the declared encoding)."""

    code, message = "MALFORMED_BODY", "Request body is not valid JSON"


class JsonTooDeep(BadRequest):
    """The JSON body nests arrays and objects deeper than ``middleware.max_json_depth``."""

    code, message = "JSON_TOO_DEEP", "Request body nests JSON too deeply"


class IdempotencyKeyMissing(BadRequest):
    """A route that requires an ``Idempotency-Key`` got none."""

    code, message = "IDEMPOTENCY_KEY_MISSING", "This route requires an Idempotency-Key header"


class IdempotencyKeyInvalid(BadRequest):
    """The ``Idempotency-Key`` is empty, too long or not printable ASCII."""

    code, message = "IDEMPOTENCY_KEY_INVALID", "Idempotency-Key must be 1 to 255 printable ASCII characters"


class IdempotencyConflict(BastionError):
    """A request with the same ``Idempotency-Key`` is still being processed."""

    status, code, grpc_status = 409, "IDEMPOTENCY_CONFLICT", "ABORTED"
    message = "A request with this Idempotency-Key is still being processed"


class IdempotencyKeyReused(BastionError):
    """The ``Idempotency-Key`` was first used with a different request (method, path, query or body)."""

    status, code, grpc_status = 422, "IDEMPOTENCY_KEY_REUSED", "INVALID_ARGUMENT"
    message = "This Idempotency-Key was used with a different request"


class TokenError(BastionError):
    """Missing or malformed credentials (RFC 6750 ``invalid_request``)."""

    status, code, message, grpc_status = 401, "UNAUTHORIZED", "Authentication required", "UNAUTHENTICATED"


class InvalidToken(TokenError):
    """The token's signature, format or claims are invalid."""

    code, message = "INVALID_TOKEN", "Invalid token"


class TokenExpired(TokenError):
    """The token's ``exp`` has passed (beyond the leeway)."""

    code, message = "TOKEN_EXPIRED", "Token has expired"


class TokenRevoked(TokenError):
    """The token's ``jti`` is on the revocation list."""

    code, message = "TOKEN_REVOKED", "Token has been revoked"


class ClientCertificateRequired(TokenError):
    """The path accepts a client certificate (``tls.path_credentials``) and the connection presented none."""

    code, message = "CLIENT_CERTIFICATE_REQUIRED", "A client certificate is required"


class ClientCertificateMismatch(TokenError):
    """``mtls_and_bearer``: the token's ``client_id`` is not the client certificate's identity."""

    code, message = "CLIENT_CERTIFICATE_MISMATCH", "The token's client_id does not match the client certificate"


class PolicyDenied(BastionError):
    """The policy decision is Deny."""

    status, code, message, grpc_status = 403, "FORBIDDEN", "Access denied by policy", "PERMISSION_DENIED"


class NotFound(BastionError):
    """A framework-level 404 (not the empty-bodied unmatched-path 404)."""

    status, code, message, grpc_status = 404, "NOT_FOUND", "Not found", "NOT_FOUND"


class MethodNotAllowed(BastionError):
    """The path exists but not for this method."""

    status, code, message, grpc_status = 405, "METHOD_NOT_ALLOWED", "Method not allowed", "UNIMPLEMENTED"


class Gone(BastionError):
    """The API version is past its enforced sunset, or in a brownout slot before it."""

    status, code, message, grpc_status = 410, "GONE", "This API version is no longer served", "NOT_FOUND"


class PayloadTooLarge(BastionError):
    """The request body exceeds ``middleware.max_body_bytes``."""

    status, code, message, grpc_status = 413, "PAYLOAD_TOO_LARGE", "Request body too large", "OUT_OF_RANGE"


class HeadersTooLarge(BastionError):
    """The request head is over ``service.max_header_bytes`` or ``service.max_headers`` (RFC 6585 5)."""

    status, code, grpc_status = 431, "HEADERS_TOO_LARGE", "RESOURCE_EXHAUSTED"
    message = "Request header fields too large"


class UnsupportedMediaType(BastionError):
    """The body's content type is not one the route accepts."""

    status, code, message, grpc_status = (
        415,
        "UNSUPPORTED_MEDIA_TYPE",
        "Unsupported media type",
        "INVALID_ARGUMENT",
    )


class ValidationFailed(BastionError):
    """The request does not match the route's declared parameters or body model."""

    status, code, message, grpc_status = (
        422,
        "VALIDATION_ERROR",
        "Request validation failed",
        "INVALID_ARGUMENT",
    )


class RateLimitExceeded(BastionError):
    """A rate-limit bucket is spent."""

    status, code, message, grpc_status = (
        429,
        "RATE_LIMIT_EXCEEDED",
        "Rate limit exceeded",
        "RESOURCE_EXHAUSTED",
    )

    def __init__(
        self, message: str | None = None, *, retry_after: int, headers: Sequence[tuple[str, str]] = ()
    ) -> None:
        self.retry_after = max(0, int(retry_after))
        super().__init__(message, headers=[("retry-after", str(self.retry_after)), *headers])

    def body(self) -> dict[str, Any]:
        return {**super().body(), "retry_after": self.retry_after}


class PolicyError(BastionError):
    """The policy could not be evaluated (and ``fail_open`` is false)."""

    code, message = "POLICY_ERROR", "Policy evaluation failed"


class TransferCodingNotImplemented(BastionError):
    """The request body has a transfer coding other than chunked, which the server does not decode (RFC 9112 6.1)."""

    status, code, grpc_status = 501, "NOT_IMPLEMENTED", "UNIMPLEMENTED"
    message = "Transfer coding not implemented"


class CacheStoreError(BastionError):
    """The cache store (Redis/Valkey) could not be reached."""

    code, message, grpc_status = "CACHE_STORE_ERROR", "Cache store unavailable", "UNAVAILABLE"


class Unavailable(BastionError):
    """The service refuses the request for now; clients may retry after ``Retry-After``."""

    status, code, message, grpc_status = 503, "SERVICE_UNAVAILABLE", "Service unavailable", "UNAVAILABLE"

    def __init__(self, message: str | None = None, *, retry_after: int | None = None) -> None:
        super().__init__(message, headers=[("retry-after", str(retry_after))] if retry_after is not None else ())


class CircuitOpen(Unavailable):
    """The inbound circuit breaker is open."""

    message = "Service unavailable: circuit open"


class BulkheadFull(Unavailable):
    """No bulkhead slot became free in time."""

    message = "Service unavailable: too many concurrent requests"


class NotReady(Unavailable):
    """A non-optional dependency is down."""

    message = "Service not ready"


class IdempotencyUnavailable(Unavailable):
    """The cache store holding idempotency keys is down (``idempotency.on_store_error = "fail_closed"``)."""

    code, message = "IDEMPOTENCY_UNAVAILABLE", "Service unavailable: idempotency store unreachable"


class BrokerUnavailable(Unavailable):
    """The broker is not connected (or refused the publish); nothing was sent."""

    code, message = "BROKER_UNAVAILABLE", "Message broker unavailable"


class NoResponders(Unavailable):
    """A broker request found nobody subscribed to answer it."""

    code, message = "NO_RESPONDERS", "No responder for the request"


class BrokerRequestFailed(BastionError):
    """The responder of a broker request answered with an error (its message stays in ``responder_error``)."""

    status, code, message, grpc_status = 502, "BROKER_REQUEST_FAILED", "The responder failed", "UNAVAILABLE"

    def __init__(self, message: str | None = None, *, responder_error: str = "") -> None:
        super().__init__(message)
        self.responder_error = responder_error


class RequestTimeout(BastionError):
    """The client did not send its request body within ``middleware.timeout_secs`` (RFC 9110 15.5.9)."""

    status, code, grpc_status = 408, "REQUEST_TIMEOUT", "DEADLINE_EXCEEDED"
    message = "Request body not received in time"


class GatewayTimeout(BastionError):
    """The handler did not answer within ``middleware.timeout_secs``."""

    status, code, message, grpc_status = 504, "GATEWAY_TIMEOUT", "Request timed out", "DEADLINE_EXCEEDED"


class BrokerTimeout(GatewayTimeout):
    """A broker request got no reply within its timeout."""

    code, message = "BROKER_TIMEOUT", "No reply from the broker in time"


def render(error: BastionError, extra_headers: Sequence[tuple[bytes, bytes]] = ()) -> tuple[int, Headers, bytes]:
    """Status, raw headers and JSON body bytes for ``error``."""
    body = json_body(error.body())
    headers: Headers = [
        JSON_CONTENT_TYPE,
        (b"content-length", str(len(body)).encode()),
        *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in error.headers),
        *extra_headers,
    ]
    if error.status == 401 and not any(name == b"www-authenticate" for name, _ in headers):
        headers.append((b"www-authenticate", b"Bearer"))  # RFC 7235 3.1: every 401 carries a challenge
    return error.status, headers, body
