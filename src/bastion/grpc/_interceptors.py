"""Per-call guards for gRPC: request id, the pipeline's security and resilience steps, message size, draining.

The checks a call passes, and their order, come from the pipeline (``bastion._pipeline.grpc_steps``): the
same source the HTTP stack is built from, never a second hand-written order.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import struct
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import CoroutineType
from typing import Any, cast

import structlog
from grpclib.const import Status
from grpclib.events import RecvRequest, SendTrailingMetadata
from grpclib.exceptions import GRPCError

from bastion import _tracing as tracing
from bastion._client_ip import parse_ip
from bastion._compat import grpclib as grpclib_compat
from bastion._exception_handlers import ExceptionHandlers, grpc_status_of
from bastion._metrics import NO_METRICS, Metrics
from bastion._parts import GrpcExtractor, GrpcFinish, Slot
from bastion._pipeline import Step
from bastion._request_ids import new_request_id, sane_request_id
from bastion._task_deadline import TaskDeadline
from bastion._tls import client_certificate
from bastion.errors import BastionError, NotFound, TokenError
from bastion.types import SCOPE_CLIENT_CERTIFICATE, SCOPE_GRPC_RESOURCE, SCOPE_REQUEST_ID, Scope
from bastion_core import running_loop
from bastion_core._logging import exception_text

DEFAULT_MESSAGE_TIMEOUT_SECS = 30.0
"""``middleware.timeout_secs``'s default: how long a unary or server-streaming call's request message may take."""
_TRUNCATED = "Request message truncated: the call ended inside it"
# The steps from the policy on wait for the request message when the method has a resource extractor.
_DEFERRABLE = frozenset({Slot.POLICY, Slot.RESILIENCE})

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("bastion_grpc_request_id", default=None)
call_var: contextvars.ContextVar[tuple[str, float] | None] = contextvars.ContextVar("bastion_grpc_call", default=None)
"""The call's method and when it started, for its duration metric when the trailers go out."""
span_var: contextvars.ContextVar[tuple[tracing.Span, object] | None] = contextvars.ContextVar(
    "bastion_grpc_span", default=None
)
"""The call's server span and its context token (tracing on)."""
# rpc.server spans are errors for these statuses only (OpenTelemetry's gRPC conventions): the others are the
# client's problem (NOT_FOUND, PERMISSION_DENIED, ...).
_SERVER_ERRORS = frozenset(
    {
        Status.UNKNOWN,
        Status.DEADLINE_EXCEEDED,
        Status.UNIMPLEMENTED,
        Status.INTERNAL,
        Status.UNAVAILABLE,
        Status.DATA_LOSS,
    }
)
trailers_var: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar(
    "bastion_grpc_trailers", default=()
)
initial_sent_var: contextvars.ContextVar[bool] = contextvars.ContextVar("bastion_grpc_initial_sent", default=False)
"""The call's initial metadata (with its request id) went out: the trailers need not repeat the id."""
log = structlog.get_logger("bastion.grpc")


def grpc_status(error: BastionError) -> Status:
    """The gRPC status of a Bastion error: its ``grpc_status`` name in grpclib's ``Status`` (INTERNAL if unknown)."""
    return Status.__members__.get(error.grpc_status, Status.INTERNAL)


def grpc_error(error: BastionError) -> GRPCError:
    """The gRPC form of a Bastion error: its status and message (never a token or a traceback).

    A token error keeps its code in the message (``TOKEN_EXPIRED: Token has expired``), as the HTTP body does.
    """
    message = f"{error.code}: {error.detail}" if isinstance(error, TokenError) else error.detail
    return GRPCError(grpc_status(error), message)


def _rejected(error: BastionError) -> GRPCError:
    """``error`` as a GRPCError; its headers (retry-after, x-ratelimit-*) travel in the trailing metadata."""
    if error.headers:
        trailers_var.set(tuple((name.lower(), value) for name, value in error.headers))
    return grpc_error(error)


class ClientFault(GRPCError):
    """The client broke its call: the request message is missing, truncated, does not decode, is too large, is
    compressed or came too slowly. The status goes to the client; the outcome says nothing about the service (no
    breaker counts it) and it is logged at info, without a traceback."""


def _refused(status: Status, reason: str) -> ClientFault:
    log.info("grpc_request_message_refused", status=status.name, reason=reason)
    return ClientFault(status, reason)


def _status_name(exc: BaseException) -> str:
    """The gRPC status a handler's exception ends its call with."""
    if isinstance(exc, GRPCError):
        return exc.status.name
    if isinstance(exc, TimeoutError):
        return "DEADLINE_EXCEEDED"
    return "UNKNOWN"


def _initial_metadata_sent() -> None:
    initial_sent_var.set(True)


async def _finish(finishes: Sequence[GrpcFinish], status: str | None) -> None:
    for finish in reversed(finishes):
        await finish(status)


class GrpcGuard:
    """Listens on grpclib's server events and runs the pipeline's gRPC steps for each call.

    Per call: draining check, request id, then ``steps`` in order (token auth -> UNAUTHENTICATED, rate limit
    -> RESOURCE_EXHAUSTED with retry trailers, policy -> PERMISSION_DENIED, the operator's hooks); each step's
    check applies its guard's exemptions (``bastion._guard``): health and reflection pass every one. For a
    method with a resource extractor the steps from the policy on run once the first request message is read
    (unary and server-streaming calls have exactly one), before the handler sees it. A Bastion error raised by a
    handler becomes its gRPC status (``NotFound`` -> NOT_FOUND).
    """

    def __init__(
        self,
        *,
        steps: Sequence[Step],
        max_message_size: int,
        message_timeout_secs: float = DEFAULT_MESSAGE_TIMEOUT_SECS,
        extractors: Mapping[str, GrpcExtractor] | None = None,
        metrics: Metrics = NO_METRICS,
        tracer: tracing.Tracer | None = None,
        exception_handlers: ExceptionHandlers | None = None,
        identity_from: Sequence[str] | None = None,
    ) -> None:
        self.exception_handlers = exception_handlers or ExceptionHandlers()
        self.identity_from = identity_from
        """With ``tls.client_auth`` on: where a client certificate's identity is read (put in each call's scope)."""
        self.metrics = metrics
        self.tracer = tracer
        self.steps = [step for step in steps if step.grpc is not None]
        deferrable = [index for index, step in enumerate(self.steps) if step.slot in _DEFERRABLE]
        self.defer_from = deferrable[0] if deferrable else len(self.steps)
        self.max_message_size = max_message_size
        self.message_timeout_secs = message_timeout_secs
        self.extractors = dict(extractors or {})
        self.draining = False
        self.active = 0
        self.idle = asyncio.Event()
        self.idle.set()

    async def on_request(self, event: RecvRequest) -> None:
        method = event.method_name
        call_var.set((method, time.perf_counter()))
        if self.draining:
            raise GRPCError(Status.UNAVAILABLE, "Server is shutting down")
        incoming = [str(value) for value in event.metadata.getall("x-request-id", [])] if event.metadata else []
        request_id = (sane_request_id(incoming[0].encode("latin-1", "replace")) if incoming else None) or (
            new_request_id()
        )
        request_id_var.set(request_id)
        structlog.contextvars.bind_contextvars(request_id=request_id, grpc_method=method)
        if self.tracer is not None:
            self._start_span(event, method, request_id)
        peer = event.peer.addr()
        peer_ip = parse_ip(str(peer[0])) if peer else None
        headers = [(b"user-agent", (event.user_agent or "").encode("latin-1", "replace"))]
        if event.metadata is not None:  # a MultiDict: str names; str values (bytes for "-bin" names)
            headers += [
                (name.lower().encode("latin-1", "replace"), value.encode("latin-1", "replace"))
                for name, value in event.metadata.items()
                if isinstance(value, str)
            ]
        scope: Scope = {
            "type": "grpc",
            "method": "POST",  # gRPC is HTTP/2 POST: route rules such as "POST /pkg.Service/*" apply
            "path": method,
            "headers": headers,
            "client": (peer_ip or "unknown", peer[1] if peer else 0),
            SCOPE_REQUEST_ID: request_id,
        }
        if self.identity_from is not None:
            scope[SCOPE_CLIENT_CERTIFICATE] = client_certificate(event.peer.cert(), self.identity_from)
        deferred = self.steps[self.defer_from :] if method in self.extractors else ()
        finishes = await self._run(self.steps[: len(self.steps) - len(deferred)], scope, [])
        event.method_func = self._wrap(event.method_func, scope, method, deferred=deferred, finishes=finishes)

    def _start_span(self, event: RecvRequest, method: str, request_id: str) -> None:
        """A server span for the call, a child of the caller's ``traceparent`` metadata when it is valid."""
        assert self.tracer is not None
        metadata = event.metadata
        parent = tracing.extract(
            (name, str(metadata[name])) for name in tracing.TRACE_HEADERS if metadata is not None and name in metadata
        )
        service, _, name = method.strip("/").partition("/")
        span = tracing.start(
            self.tracer,
            method.lstrip("/"),
            parent=parent,
            kind=tracing.SERVER,
            attributes={
                "rpc.system": "grpc",
                "rpc.service": service,
                "rpc.method": name,
                "bastion.request_id": request_id,
            },
        )
        span_var.set((span, tracing.activate(span)))
        structlog.contextvars.bind_contextvars(**tracing.ids(span))

    @staticmethod
    async def _run(steps: Sequence[Step], scope: Scope, finishes: list[GrpcFinish]) -> list[GrpcFinish]:
        """Run ``steps`` in order, collecting what they want to hear about the outcome; on a rejection tell
        the earlier ones the call was never made (``None``), then raise it as a GRPCError."""
        for step in steps:
            assert step.grpc is not None
            try:
                result = step.grpc(scope)  # the outcome, or the coroutine that finishes the check
                finish = cast("GrpcFinish | None", await result if type(result) is CoroutineType else result)
            except BastionError as exc:
                await _finish(finishes, None)
                raise _rejected(exc) from None
            except BaseException:
                await _finish(finishes, None)
                raise
            if finish is not None:
                finishes.append(finish)
        return finishes

    def _wrap(
        self, method_func: Any, scope: Scope, method: str, *, deferred: Sequence[Step], finishes: list[GrpcFinish]
    ) -> Any:
        guard = self

        async def guarded(stream: Any) -> None:
            stream.recv_message = guard._bounded_recv(stream)
            stream.send_initial_metadata = grpclib_compat.initial_metadata_sender(
                stream, scope[SCOPE_REQUEST_ID], sent=_initial_metadata_sent
            )
            stream.send_trailing_metadata = grpclib_compat.trailing_metadata_sender(stream, guard._ending)
            if deferred:
                try:
                    first = await stream.recv_message()
                except BaseException:
                    await _finish(finishes, None)
                    raise
                try:
                    scope[SCOPE_GRPC_RESOURCE] = await guard._resource(method, first)
                except BastionError as exc:  # the extractor's NotFound: answered before the policy
                    await _finish(finishes, None)
                    raise _rejected(exc) from None
                await guard._run(deferred, scope, finishes)
                replay = [first]
                original = stream.recv_message

                async def recv_message() -> Any:
                    return replay.pop() if replay else await original()

                stream.recv_message = recv_message
            guard.active += 1
            guard.idle.clear()
            outcome: str | None = "OK"
            try:
                await method_func(stream)
            except BastionError as exc:
                outcome = exc.grpc_status
                raise grpc_error(exc) from None
            except (ClientFault, asyncio.CancelledError):
                # A broken request message, or the client cancelled or let its deadline pass (grpclib cancels the
                # handler for both; so does a shutdown): nothing the breaker should learn from.
                outcome = None
                raise
            except Exception as exc:
                handled = await guard._handled(exc, scope)
                if handled is None:
                    outcome = _status_name(exc)
                    raise
                outcome = handled.grpc_status
                raise grpc_error(handled) from None
            except BaseException as exc:
                outcome = _status_name(exc)
                raise
            finally:
                await _finish(finishes, outcome)
                guard.active -= 1
                if not guard.active:
                    guard.idle.set()

        return guarded

    async def _resource(self, method: str, message: Any) -> dict[str, Any]:
        """The resource attributes of ``method``'s extractor for ``message``; ``None`` from it is NotFound."""
        if message is None:
            return {}
        attributes = self.extractors[method](message)
        if inspect.isawaitable(attributes):
            attributes = await attributes
        if attributes is None:
            raise NotFound()
        return dict(attributes)

    async def _handled(self, exc: Exception, scope: Scope) -> BastionError | None:
        """The error the service's exception handler for ``exc`` answers (``None`` without one)."""
        if isinstance(exc, GRPCError) or not self.exception_handlers:
            return None
        try:
            handled = await self.exception_handlers.handle(exc, scope)
        except Exception as failure:
            log.error(
                "exception_handler_failed",
                grpc_method=scope["path"],
                handled=type(exc).__name__,
                exception=exception_text(failure),
            )
            return BastionError()
        return None if handled is None else grpc_status_of(handled)

    def _bounded_recv(self, stream: Any) -> Callable[[], Awaitable[Any]]:
        """grpclib's recv_message, reading the message itself to refuse a broken one as the client's fault
        (ClientFault):

        - larger than ``max_message_size``: RESOURCE_EXHAUSTED from the 5-byte prefix, before it is read;
        - compressed: UNIMPLEMENTED;
        - for a call whose client sends one message (unary, server-streaming): not all there within
          ``message_timeout_secs`` (``middleware.timeout_secs``, as an HTTP body): DEADLINE_EXCEEDED; the client
          ended the stream without it: INVALID_ARGUMENT;
        - the client ended the stream inside it, or it does not decode: INTERNAL (gRPC's status for a request
          that does not parse).

        A client-streaming call may wait between messages as long as its client likes (its own deadline rules).
        """
        limit = self.max_message_size
        single = not grpclib_compat.client_streams(stream)
        timeout = self.message_timeout_secs if single else None
        received = 0

        async def recv_message() -> Any:
            nonlocal received
            if timeout is None or grpclib_compat.request_ended(stream):  # nothing to wait for: no timer
                data = await read()
            else:
                loop = running_loop()
                task = asyncio.current_task(loop)
                assert task is not None
                late = TaskDeadline(task)
                timer = loop.call_at(loop.time() + timeout, late.expire)
                try:
                    data = await read()
                except asyncio.CancelledError:
                    if not late.expired or task.uncancel() > late.cancelling:
                        raise
                    raise _refused(
                        Status.DEADLINE_EXCEEDED, f"Request message not received within {timeout:g}s"
                    ) from None
                finally:
                    timer.cancel()
            if data is None:
                if single and not received:
                    raise _refused(Status.INVALID_ARGUMENT, "Request message missing: the call ended without one")
                return None
            try:
                message = grpclib_compat.decode_request(stream, data)
            except Exception:  # the codec's error (protobuf's DecodeError): the bytes are the client's
                raise _refused(Status.INTERNAL, "Request message does not decode") from None
            received += 1
            return await grpclib_compat.received(stream, message)

        async def read() -> bytes | None:
            try:
                prefix = await grpclib_compat.recv_bytes(stream, 5)
                if not prefix:
                    return None
                if prefix[:1] != b"\x00":
                    raise _refused(Status.UNIMPLEMENTED, "Compressed messages are not supported")
                (length,) = struct.unpack(">I", prefix[1:])
                if length > limit:
                    raise _refused(Status.RESOURCE_EXHAUSTED, f"Message of {length} bytes exceeds the limit of {limit}")
                data = await grpclib_compat.recv_bytes(stream, length)
            except grpclib_compat.StreamEnded:
                raise _refused(Status.INTERNAL, _TRUNCATED) from None
            if len(data) != length:  # the stream ended right after the prefix
                raise _refused(Status.INTERNAL, _TRUNCATED)
            return data

        return recv_message

    async def on_trailing_metadata(self, event: SendTrailingMetadata) -> None:
        """The trailers of a call its handler never ran for (refused), or with the handler's own metadata."""
        for name, value in self._ending(event.status, not initial_sent_var.get()):
            if name != "x-request-id" or name not in event.metadata:
                event.metadata[name] = value

    def _ending(self, status: Status, trailers_only: bool) -> list[tuple[str, str]]:
        """The call ends with ``status``: its duration metric and span; the trailing metadata Bastion adds (the
        request id in a trailers-only answer, a rejection's headers)."""
        call = call_var.get()
        if call is not None:
            # Every call ends here, refused ones included: the status is the one the client gets.
            self.metrics.grpc_call(call[0], int(status.value), time.perf_counter() - call[1])
        request_id = request_id_var.get()
        added = list(trailers_var.get())
        if request_id is not None and trailers_only:
            # A trailers-only answer (a refused call): the id travels here, the client's only metadata.
            added.insert(0, ("x-request-id", request_id))
        traced = span_var.get()
        if traced is not None:
            span_var.set(None)
            span, token = traced
            span.set_attribute("rpc.grpc.status_code", int(status.value))
            if status in _SERVER_ERRORS:
                span.set_status(tracing.ERROR)
            span.end()
            tracing.deactivate(token)
        return added
