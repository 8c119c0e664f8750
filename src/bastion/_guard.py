"""Capabilities are guards: one check for every connection, exemptions as data, one adapter per protocol.

A :class:`Guard` checks an HTTP request, a WebSocket handshake or a gRPC call alike: ``await guard.check(scope)``
rejects by raising a :class:`~bastion.errors.BastionError` and may return an :data:`Outcome` callback, told how
the connection ended. Who skips the guard is data (:class:`Exemptions`), read by both adapters: :class:`GuardLayer`
(the HTTP/WebSocket ASGI layer, one for every guard) and :func:`grpc_check` (the same check at the same position
for a gRPC call, run by ``bastion.grpc``). Token auth, rate limiting, policy and resilience are guards; so is
whatever an operator plugs in with ``service.use(slot, guard)``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from types import CoroutineType
from typing import Any, Protocol, cast, runtime_checkable

from starlette.requests import ClientDisconnect

from bastion._health import ALWAYS_PUBLIC
from bastion.middleware._errors import as_bastion_error
from bastion.middleware._limits import stalled_on_body
from bastion.routing._resolve import ResolvedRoute
from bastion.types import SCOPE_CLAIMS, SCOPE_ROUTE, ASGIApp, Message, Receive, Scope, Send

Outcome = Callable[[str | None], Awaitable[None]]
"""Called once a checked connection is over, with its outcome as a gRPC status name, or ``None`` when the outcome
says nothing about the service: its handler never ran (a later step refused it), or the client left, cancelled,
let its deadline pass or sent a broken request.

An HTTP request or WebSocket session ends ``"OK"`` (a response below 500, or a Bastion error below 500 raised
further in), ``"INTERNAL"`` (a 5xx response, an unexpected exception) or ``"DEADLINE_EXCEEDED"`` (the timeout
stopped its handler); a gRPC call ends with the status its client gets."""

Check = Callable[[Scope], Awaitable[Outcome | None]]
"""``async check(scope)``: a guard's check for a gRPC call, or an operator's plain gRPC hook."""

Later = Coroutine[Any, Any, "Outcome | None"]
CheckNow = Callable[[Scope], "Outcome | Later | None"]
"""``check_now(scope)``: a guard's check without a coroutine of its own where it need not wait (a cached token, a
cached decision, the local limiter): what ``check`` returns, or, when it must wait, a coroutine of the rest of the
check (nothing done yet that running it would repeat) for the adapter to await."""


GRPC_BUILT_IN = ("/grpc.health.v1.Health/", "/grpc.reflection.v1.ServerReflection/", "/grpc.reflection.v1alpha.")
"""gRPC health and reflection methods: exempt from every check (spec, endpoints rule 4), as ``/health`` and
``/ready`` are over HTTP."""
EVERY_CONNECTION = frozenset({"http", "websocket", "grpc"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Exemptions:
    """Who passes a guard unchecked.

    - ``scope_types``: the connections it checks (``"http"``, ``"websocket"``, ``"grpc"``); others pass.
    - ``built_in``: Bastion's own endpoints pass: ``/health``, ``/ready``, gRPC health and reflection.
    - ``public_paths``: path prefixes that pass, matched on segment boundaries (``/public`` passes ``/public``
      and ``/public/x``, not ``/publicity``); for gRPC a method (``/pkg.Service/Method``) or service prefix.
    - ``preflight``: CORS preflights (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) pass.
    - ``public_routes``: framework routes marked public (the API docs with ``service.api_docs_public``) pass.
    - ``other_methods``: a request whose path exists only with other methods passes (the dispatcher answers 405
      the same for every caller).
    - ``unmatched``: says whether an HTTP request or WebSocket handshake reaches nothing the service serves; one
      that does not and carries claims (an authenticated caller) passes: the dispatcher answers the empty 404.
      An anonymous one is still checked, so route existence is not revealed to it (docs/policy.md).
    """

    scope_types: frozenset[str] = EVERY_CONNECTION
    built_in: bool = True
    public_paths: tuple[str, ...] = ()
    preflight: bool = False
    public_routes: bool = False
    other_methods: bool = False
    unmatched: Callable[[Scope], bool] | None = None

    def skips(self, scope: Scope) -> bool:
        """Whether the connection of ``scope`` passes unchecked."""
        kind = scope["type"]
        if kind not in self.scope_types:
            return True
        path: str = scope["path"]
        if kind == "grpc":
            return (self.built_in and path.startswith(GRPC_BUILT_IN)) or _below(path, self.public_paths)
        if self.built_in and path in ALWAYS_PUBLIC:
            return True
        if self.public_paths and _below(path, self.public_paths):
            return True
        if self.preflight and scope.get("method") == "OPTIONS" and _is_preflight(scope):
            return True
        if self.public_routes or self.other_methods:
            route: ResolvedRoute | None = scope.get(SCOPE_ROUTE)
            if route is not None:
                if route.method_allowed:
                    return self.public_routes and route.entry.public
                return self.other_methods
        if self.unmatched is not None and scope.get(SCOPE_CLAIMS) is not None:
            return self.unmatched(scope)
        return False


def _below(path: str, prefixes: tuple[str, ...]) -> bool:
    """Whether ``path`` is one of ``prefixes`` or below one of them (on a segment boundary)."""
    return any(path == prefix or path.startswith(prefix + "/") for prefix in prefixes)


@runtime_checkable
class Guard(Protocol):
    """A capability's check of one connection: an HTTP request, a WebSocket handshake or a gRPC call.

    ``check`` rejects by raising a BastionError (its status, code and headers are the reply: 401, 429, 403, 503;
    over gRPC its ``grpc_status``, the headers in the trailers) and may return an :data:`Outcome` callback. It
    may write the scope for later steps (token auth puts the claims in ``scope[SCOPE_CLAIMS]``). ``exemptions``
    says who never reaches ``check``.
    """

    @property
    def exemptions(self) -> Exemptions: ...

    async def check(self, scope: Scope) -> Outcome | None: ...


def check_now_of(guard: Guard) -> CheckNow:
    """The guard's ``check_now`` when it has one (the built-in guards: an optional fast path, not part of the
    protocol), else its ``check`` (a coroutine function: calling it gives the coroutine the adapter awaits)."""
    now: CheckNow | None = getattr(guard, "check_now", None)
    if now is not None:
        return now
    check = guard.check
    if inspect.iscoroutinefunction(check):
        return check

    async def awaited(scope: Scope) -> Outcome | None:
        return await check(scope)

    return awaited


def _is_preflight(scope: Scope) -> bool:
    if scope.get("method") != "OPTIONS":
        return False
    names = {name for name, _ in scope["headers"]}
    return b"origin" in names and b"access-control-request-method" in names


class Cleanup:
    """An outcome that does not read the status: ``callback()`` runs once the connection is over, however it ends.

    The adapter then tracks no response status for it, so it costs one ``try``/``finally`` (token auth unbinds the
    caller's ``sub`` from the log context this way, on every authenticated request).
    """

    __slots__ = ("callback",)

    def __init__(self, callback: Callable[[], object]) -> None:
        self.callback = callback

    async def __call__(self, status: str | None) -> None:
        self.callback()


class GuardLayer:
    """The HTTP/WebSocket ASGI layer of any guard: skip the exempt, check the rest, report the outcome."""

    __slots__ = ("app", "check", "skips")

    def __init__(self, app: ASGIApp, *, guard: Guard) -> None:
        self.app = app
        self.check = check_now_of(guard)
        self.skips = guard.exemptions.skips

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.skips(scope):
            await self.app(scope, receive, send)
            return
        result = self.check(scope)
        outcome = cast("Outcome | None", await result if type(result) is CoroutineType else result)
        if outcome is None:
            await self.app(scope, receive, send)
            return
        if type(outcome) is Cleanup:
            try:
                await self.app(scope, receive, send)
            finally:
                outcome.callback()
            return
        # Report how the request ended (see Outcome); inline, not a helper: this is every guarded request.
        status = 0

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        except ClientDisconnect:
            await outcome(None)  # the client left before the answer: nothing learnt
            raise
        except Exception as exc:
            error = as_bastion_error(exc)
            await outcome("OK" if error is not None and error.status < 500 else "INTERNAL")
            raise
        except asyncio.CancelledError:
            # The timeout layer's deadline: a handler that hangs says something about the service; a client too
            # slow sending its body (the 408) does not.
            await outcome(None if stalled_on_body(scope) else "DEADLINE_EXCEEDED")
            raise
        except BaseException:
            await outcome(None)
            raise
        await outcome("OK" if status < 500 else "INTERNAL")


def guard_layer(guard: Guard) -> Callable[[ASGIApp], ASGIApp]:
    """``app -> app``: the guard's HTTP/WebSocket layer (what ``service.use(slot, layer)`` takes)."""

    def layer(app: ASGIApp) -> ASGIApp:
        return GuardLayer(app, guard=guard)

    return layer


MAX_GRPC_EXEMPTION_METHODS = 1024
"""gRPC methods whose exemption a guard's gRPC check remembers (a method's exemption is decided once, not per
call); calls to methods beyond these are decided each time."""


def grpc_check(guard: Guard) -> CheckNow:
    """The guard's check for a gRPC call, its exemptions applied (what the gRPC server runs at its step): a plain
    call, which returns the outcome or, when the guard must wait, the coroutine that finishes the check.

    A gRPC call's exemption depends on its method alone: decided once per method (up to
    :data:`MAX_GRPC_EXEMPTION_METHODS`)."""
    skips, check = guard.exemptions.skips, check_now_of(guard)
    exempt: dict[str, bool] = {}

    def hook(scope: Scope) -> Outcome | Later | None:
        method: str = scope["path"]
        skipped = exempt.get(method)
        if skipped is None:
            skipped = skips(scope)
            if len(exempt) < MAX_GRPC_EXEMPTION_METHODS:
                exempt[method] = skipped
        return None if skipped else check(scope)

    return hook


def skipping_built_in(hook: Check) -> CheckNow:
    """An operator's plain gRPC hook (``service.use(slot, layer, grpc=hook)``), not run for health and reflection."""

    async def checked(scope: Scope) -> Outcome | None:
        if _BUILT_IN_ONLY.skips(scope):
            return None
        return await hook(scope)

    return checked


_BUILT_IN_ONLY = Exemptions(scope_types=frozenset({"grpc"}))
