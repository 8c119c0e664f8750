"""Per-call guards for gRPC: request id, token auth, policy, message size, draining (grpclib events)."""

from __future__ import annotations

import asyncio
import contextvars
import re
import struct
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import structlog
from grpclib.const import Status
from grpclib.events import RecvRequest, SendInitialMetadata, SendTrailingMetadata
from grpclib.exceptions import GRPCError

from bastion.audit import Auditor
from bastion.auth.claims import Claims
from bastion.auth.middleware import bearer_token
from bastion.auth.setup import TokenAuth
from bastion.client_ip import parse_ip
from bastion.errors import BastionError, PolicyDenied, TokenError
from bastion.policy.authorizer import RESOURCE_TYPE, PolicyAuthorizer
from bastion.types import SCOPE_CLAIMS, SCOPE_REQUEST_ID

EXEMPT_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1.ServerReflection/", "/grpc.reflection.v1alpha.")
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@/+=~-]{1,128}")

GrpcHook = Callable[[dict[str, Any]], Awaitable[None]]
GrpcResourceExtractor = Callable[[Any], Mapping[str, Any]]
"""``request message -> resource attributes`` for one method (e.g. ``owner_id`` from ``GetDocumentRequest``)."""

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("bastion_grpc_request_id", default=None)
trailers_var: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar(
    "bastion_grpc_trailers", default=()
)
log = structlog.get_logger("bastion.grpc")

_STATUS_OF = {
    "UNAUTHENTICATED": Status.UNAUTHENTICATED,
    "PERMISSION_DENIED": Status.PERMISSION_DENIED,
    "RESOURCE_EXHAUSTED": Status.RESOURCE_EXHAUSTED,
    "UNAVAILABLE": Status.UNAVAILABLE,
    "INVALID_ARGUMENT": Status.INVALID_ARGUMENT,
    "DEADLINE_EXCEEDED": Status.DEADLINE_EXCEEDED,
}


def grpc_error(error: BastionError) -> GRPCError:
    """The gRPC form of a Bastion error: its ``grpc_status`` and message (never a token or a traceback)."""
    return GRPCError(_STATUS_OF.get(error.grpc_status, Status.INTERNAL), error.detail)


def _metadata_values(metadata: Any, key: str) -> list[str]:
    return [str(value) for value in metadata.getall(key, [])] if metadata is not None else []


class GrpcGuard:
    """Listens on grpclib's server events and applies the HTTP pipeline's rules to each call.

    Order per call: draining check, request id, token auth (UNAUTHENTICATED), rate limit hook
    (RESOURCE_EXHAUSTED), policy (PERMISSION_DENIED; action ``/<package>.<Service>/<Method>``). Health and
    reflection are exempt from auth and policy; ``token.public_paths`` prefixes mark public methods.
    """

    def __init__(
        self,
        *,
        token_auth: TokenAuth | None,
        policy: PolicyAuthorizer | None,
        auditor: Auditor,
        max_message_size: int,
        extractors: Mapping[str, GrpcResourceExtractor] | None = None,
        rate_limit: GrpcHook | None = None,
        token_hooks: Sequence[GrpcHook] = (),
        rate_limit_hooks: Sequence[GrpcHook] = (),
        policy_hooks: Sequence[GrpcHook] = (),
    ) -> None:
        self.token_hooks = tuple(token_hooks)
        self.rate_limit_hooks = tuple(rate_limit_hooks)
        self.policy_hooks = tuple(policy_hooks)
        self.token_auth = token_auth
        self.policy = policy
        self.auditor = auditor
        self.max_message_size = max_message_size
        self.extractors = dict(extractors or {})
        self.rate_limit = rate_limit
        self.draining = False
        self.active = 0
        self.idle = asyncio.Event()
        self.idle.set()

    def _public(self, method: str) -> bool:
        if method.startswith(EXEMPT_PREFIXES):
            return True
        rules = self.token_auth.rules if self.token_auth is not None else None
        if rules is None:
            return True
        return any(method == p or method.startswith(p + "/") for p in rules.public_prefixes)

    async def on_request(self, event: RecvRequest) -> None:
        method = event.method_name
        if self.draining:
            raise GRPCError(Status.UNAVAILABLE, "Server is shutting down")
        incoming = _metadata_values(event.metadata, "x-request-id")
        request_id = incoming[0] if incoming and _SANE_REQUEST_ID.fullmatch(incoming[0]) else uuid.uuid4().hex
        request_id_var.set(request_id)
        structlog.contextvars.bind_contextvars(request_id=request_id, grpc_method=method)
        peer = event.peer.addr()
        peer_ip = parse_ip(str(peer[0])) if peer else None
        headers = [(b"user-agent", (event.user_agent or "").encode("latin-1", "replace"))]
        if event.metadata is not None:
            headers.extend(
                (str(name).lower().encode("latin-1", "replace"), str(value).encode("latin-1", "replace"))
                for name, value in event.metadata.items()
                if isinstance(value, str)
            )
        scope: dict[str, Any] = {
            "type": "grpc",
            "method": "POST",  # gRPC is HTTP/2 POST: route rules such as "POST /pkg.Service/*" apply
            "path": method,
            "headers": headers,
            "client": (peer_ip or "unknown", peer[1] if peer else 0),
            SCOPE_REQUEST_ID: request_id,
        }
        exempt = method.startswith(EXEMPT_PREFIXES)
        if not self._public(method) and self.token_auth is not None:
            await self._authenticate(event, scope)
        if not exempt:
            await self._run_hooks(self.token_hooks, scope)
        if self.rate_limit is not None and not exempt:
            try:
                await self.rate_limit(scope)
            except BastionError as exc:
                # Retry information travels in trailing metadata (retry-after, x-ratelimit-*).
                trailers_var.set(tuple((name.lower(), value) for name, value in exc.headers))
                raise grpc_error(exc) from None
        if not exempt:
            await self._run_hooks(self.rate_limit_hooks, scope)
        claims = scope.get(SCOPE_CLAIMS)
        claims = claims if isinstance(claims, Claims) else None
        # Every call but health and reflection is decided, those without claims as the anonymous principal.
        deferred = not exempt and self.policy is not None and method in self.extractors
        if not exempt and self.policy is not None and not deferred:
            await self._authorize(scope, claims, method, {})
        if not exempt and not deferred:
            await self._run_hooks(self.policy_hooks, scope)
        event.method_func = self._wrap(event.method_func, scope, deferred, claims, method)

    @staticmethod
    async def _run_hooks(hooks: Sequence[GrpcHook], scope: dict[str, Any]) -> None:
        for hook in hooks:
            try:
                await hook(scope)
            except BastionError as exc:
                raise grpc_error(exc) from None

    async def _authenticate(self, event: RecvRequest, scope: dict[str, Any]) -> Claims:
        assert self.token_auth is not None
        values = [value.encode("latin-1", "replace") for value in _metadata_values(event.metadata, "authorization")]
        try:
            token = bearer_token(values, max_token_bytes=self.token_auth.settings.max_token_bytes)
            claims = await self.token_auth.tokens.claims(token)
            if self.token_auth.revocations is not None:
                await self.token_auth.revocations.check(claims)
        except TokenError as exc:
            raise GRPCError(Status.UNAUTHENTICATED, f"{exc.code}: {exc.detail}") from None
        except BastionError as exc:
            raise grpc_error(exc) from None
        scope[SCOPE_CLAIMS] = claims
        if claims.sub is not None:
            structlog.contextvars.bind_contextvars(sub=claims.sub)
        return claims

    async def _authorize(
        self, scope: dict[str, Any], claims: Claims | None, method: str, resource: dict[str, Any]
    ) -> None:
        assert self.policy is not None
        context = {
            "ip_address": scope["client"][0],
            "timestamp": self.policy.now(),
            "user_agent": scope["headers"][0][1].decode("latin-1"),
            "request_id": scope[SCOPE_REQUEST_ID],
            "roles": list(claims.roles) if claims is not None else [],
        }
        decision = self.policy.decide_request(
            claims=claims, action=method, resource=(RESOURCE_TYPE, method, resource), context=context
        )
        if decision.failed:
            fail_open = self.policy.fails_open(claims)
            log.error("policy_evaluation_failed", action=method, errors=list(decision.errors), fail_open=fail_open)
            if fail_open:
                return
            raise GRPCError(Status.INTERNAL, "Policy evaluation failed")
        if not decision.allowed:
            await self.auditor.auth_event("AuthPermissionDenied", scope, action=method)
            raise grpc_error(PolicyDenied())

    def _wrap(self, method_func: Any, scope: dict[str, Any], deferred: bool, claims: Claims | None, method: str) -> Any:
        guard = self

        async def guarded(stream: Any) -> None:
            stream.recv_message = guard._bounded_recv(stream)
            if deferred:
                first = await stream.recv_message()
                resource = dict(guard.extractors[method](first)) if first is not None else {}
                await guard._authorize(scope, claims, method, resource)
                await guard._run_hooks(guard.policy_hooks, scope)
                replay = [first]
                original = stream.recv_message

                async def recv_message() -> Any:
                    return replay.pop() if replay else await original()

                stream.recv_message = recv_message
            guard.active += 1
            guard.idle.clear()
            try:
                await method_func(stream)
            finally:
                guard.active -= 1
                if not guard.active:
                    guard.idle.set()

        return guarded

    def _bounded_recv(self, stream: Any) -> Callable[[], Awaitable[Any]]:
        """grpclib's recv_message with a size check on the 5-byte prefix, before the message is read."""
        limit = self.max_message_size

        async def recv_message() -> Any:
            meta = await stream._stream.recv_data(5)
            if not meta:
                return None
            if meta[:1] != b"\x00":
                raise GRPCError(Status.UNIMPLEMENTED, "Compressed messages are not supported")
            (length,) = struct.unpack(">I", meta[1:])
            if length > limit:
                raise GRPCError(Status.RESOURCE_EXHAUSTED, f"Message of {length} bytes exceeds the limit of {limit}")
            data = await stream._stream.recv_data(length)
            message = stream._codec.decode(data, stream._recv_type)
            (message,) = await stream._dispatch.recv_message(message)
            stream._messages_received += 1
            stream._stream.connection.messages_received += 1
            stream._stream.connection.last_message_received = time.monotonic()
            return message

        return recv_message

    async def on_initial_metadata(self, event: SendInitialMetadata) -> None:
        request_id = request_id_var.get()
        if request_id is not None:
            event.metadata["x-request-id"] = request_id

    async def on_trailing_metadata(self, event: SendTrailingMetadata) -> None:
        request_id = request_id_var.get()
        if request_id is not None and "x-request-id" not in event.metadata:
            event.metadata["x-request-id"] = request_id
        for name, value in trailers_var.get():
            event.metadata[name] = value
