"""The idempotency step: a repeated ``Idempotency-Key`` replays the stored response instead of running the handler.

draft-ietf-httpapi-idempotency-key-header. It sits after token auth, rate limiting and policy (a replay is still
authenticated, charged and authorized) and before resilience and the handler. On a route that takes a key:

- no key: 400 ``IDEMPOTENCY_KEY_MISSING`` when ``[idempotency] required`` (default), else the request runs as usual;
  a key that is empty, too long or not printable: 400 ``IDEMPOTENCY_KEY_INVALID``;
- a caller without ``sub`` or ``client_id`` (no token): the request runs as usual, nothing is stored (an IP address
  is no identity to replay a response to);
- the first request with a key claims it in the cache store (atomically: one ``SET NX GET`` on Redis/Valkey) and
  runs; a response below 500 whose body came in one piece of at most ``max_response_bytes`` is stored for
  ``ttl_secs`` (status, the handler's headers, body) before its last byte is sent. Anything else (a 5xx, an error
  raised by the handler, a streaming or oversized body) is not stored, the claim is released, and a retry runs;
- a repeat with the same fingerprint (method, path, query, body) replays the stored response with
  ``Idempotent-Replayed: true``; a different fingerprint: 422 ``IDEMPOTENCY_KEY_REUSED``; while the first still runs:
  409 ``IDEMPOTENCY_CONFLICT``;
- the cache store down: ``on_store_error = "fail_closed"`` (default) answers 503 ``IDEMPOTENCY_UNAVAILABLE`` without
  running the handler; ``"fail_open"`` runs it without idempotency.

The request body is read whole (bounded by ``middleware.max_body_bytes``, enforced further out) and handed on.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from bastion._cache_store import CacheStore, MemoryCacheStore
from bastion._metrics import NO_METRICS, Metrics
from bastion.config import IdempotencySettings
from bastion.errors import (
    CacheStoreError,
    IdempotencyConflict,
    IdempotencyKeyMissing,
    IdempotencyKeyReused,
    IdempotencyUnavailable,
)
from bastion.idempotency._keys import (
    RUNNING,
    IdempotentRoutes,
    Stored,
    fingerprint,
    local_fingerprint,
    local_key,
    local_record,
    parse_key,
    read_local_record,
    read_record,
    record_key,
    record_of,
    response_head,
    running_record,
)
from bastion.types import SCOPE_CLAIMS, ASGIApp, Message, ReadAhead, Receive, Scope, Send

log = structlog.get_logger("bastion.idempotency")

HEADER = b"idempotency-key"
REPLAYED = (b"idempotent-replayed", b"true")
_CLAIM_ATTEMPTS = 2  # a record that expires between the failed claim and the read is claimed again once


class IdempotencyMiddleware:
    """Replay stored responses for repeated ``Idempotency-Key`` s on ``routes`` (see the module docstring).

    Reads scope[SCOPE_CLAIMS] (the caller), so it sits inside token auth and policy. Raises the 400, 409, 422 and
    503 errors above; records ``bastion_idempotency_requests{outcome}``.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        settings: IdempotencySettings,
        routes: IdempotentRoutes,
        store: CacheStore,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self.app = app
        self.settings = settings
        self.routes = routes
        self.match = routes.match
        self.store = store
        self.local = store if isinstance(store, MemoryCacheStore) else None
        """The in-process store (no I/O): claimed, stored and released by plain calls, not awaited coroutines."""
        shared = self.local is None
        self.name, self.fingerprint = (record_key, fingerprint) if shared else (local_key, local_fingerprint)
        """A record's name and a request's fingerprint: SHA-256 in a shared store (the same on every instance); in
        memory the name unhashed when it fits, the fingerprint the request itself when short (this process's own)."""
        self.read = read_record if shared else read_local_record
        self.metrics = metrics
        self.required, self.max_key_length = settings.required, settings.max_key_length
        self.in_flight, self.ttl = settings.in_flight_secs, settings.ttl_secs
        self.max_response_bytes = settings.max_response_bytes
        self._releasing: set[asyncio.Task[None]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.match(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        raw = None
        for name, value in scope["headers"]:
            if name == HEADER:
                raw = value
                break
        claims = scope.get(SCOPE_CLAIMS)
        sub = getattr(claims, "sub", None)  # None without claims too
        caller = f"user:{sub}" if sub else _client(claims)
        if raw is None or caller is None:
            if raw is None and self.required:
                raise IdempotencyKeyMissing()
            await self.app(scope, receive, send)
            return
        key = self.name(caller, parse_key(raw, max_length=self.max_key_length))
        message = await receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            body: bytes = message.get("body", b"")  # the usual request: one message, handed on as it came
        else:
            body = await _read_rest(message, receive)
            message = {"type": "http.request", "body": body, "more_body": False}
        print_ = self.fingerprint(scope["method"], scope["path"], scope.get("query_string", b""), body)
        local = self.local
        try:
            if local is not None and local.claim_now(key, RUNNING + print_, ttl_secs=self.in_flight) is None:
                stored = None  # the usual case, in a plain call; a key already held is read by _claim (same answer)
            else:
                stored = await self._claim(key, print_)
        except CacheStoreError:
            self.metrics.idempotency("store_error")
            if self.settings.on_store_error == "fail_closed":
                raise IdempotencyUnavailable() from None
            await self.app(scope, _Holder(self, key, print_, message, receive, send).receive, send)
            return
        if stored is not None:
            await self._found(stored, print_, send)
            return
        # This request holds the key: the handler runs in this coroutine (no second one per request); its response
        # is stored if it qualifies, else the key is released.
        holder = _Holder(self, key, print_, message, receive, send)
        try:
            await self.app(scope, holder.receive, holder)
        except BaseException:
            self._release(key)
            raise
        if not holder.done:
            self.metrics.idempotency("not_stored")
            self._release(key)

    async def _claim(self, key: str, print_: bytes) -> Stored | None:
        """``None`` when this request now holds the key; else the record found (CacheStoreError propagates)."""
        for _ in range(_CLAIM_ATTEMPTS):
            raw = await self.store.claim(key, running_record(print_), ttl_secs=self.in_flight)
            if raw is None:
                return None
            found = self.read(raw)
            if found is not None:
                return found
            await self.store.delete(key)  # an unreadable record: the key is free again
        raise IdempotencyConflict()

    async def _found(self, stored: Stored, print_: bytes, send: Send) -> None:
        """The answer to a request whose key another request holds or held: 422, 409 or the stored response."""
        if stored.fingerprint != print_:
            self.metrics.idempotency("mismatch")
            raise IdempotencyKeyReused()
        if stored.running:
            self.metrics.idempotency("conflict")
            raise IdempotencyConflict()
        self.metrics.idempotency("replayed")
        await _replay(stored, send)

    async def _store(self, key: str, record: bytes) -> bool:
        try:
            await self.store.set(key, record, ttl_secs=self.ttl)
        except CacheStoreError:
            # The response still goes out; the claim expires after in_flight_secs (409 until then).
            self.metrics.idempotency("store_error")
            return True
        self.metrics.idempotency("stored")
        return True

    def _release(self, key: str) -> None:
        """Free the key for a retry: at once on the in-process store, else in the background (the request may be
        being cancelled)."""
        if self.local is not None:
            self.local.delete_now(key)
            return

        async def release() -> None:
            with contextlib.suppress(CacheStoreError):  # else the claim expires after in_flight_secs
                await self.store.delete(key)

        task = asyncio.get_running_loop().create_task(release())
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)


def _client(claims: object) -> str | None:
    """The caller of a token without ``sub`` (the usual caller, ``user:<sub>``, is named inline): ``client:<id>``."""
    client_id = getattr(claims, "client_id", None)
    return f"client:{client_id}" if client_id else None


async def _read_rest(message: Message, receive: Receive) -> bytes:
    """The whole body of a request whose first ``receive`` gave ``message`` and more was to come (or none)."""
    if message["type"] != "http.request":
        return b""
    chunks = [message.get("body", b"")]
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


class _Holder(ReadAhead):
    """A request that holds its key, on its way through the handler: :meth:`receive` hands over the body the step
    read (the whole of it, in one message), then waits on the client as usual (a compiled handler takes the body
    with :meth:`take_body` instead); the object itself is the handler's ``send`` and stores the response if it
    qualifies (``done`` once stored). One object per request, for both."""

    __slots__ = ("done", "first", "head", "key", "next_receive", "print_", "send", "step")

    def __init__(
        self, step: IdempotencyMiddleware, key: str, print_: bytes, first: Message, receive: Receive, send: Send
    ) -> None:
        self.step, self.key, self.print_ = step, key, print_
        self.first: Message | None = first
        self.next_receive, self.send = receive, send
        self.head: bytes | None = None
        """The response's status and headers while it may still be stored."""
        self.done = False

    async def receive(self) -> Message:
        first, self.first = self.first, None
        return first if first is not None else await self.next_receive()

    def take_body(self) -> bytes | None:
        first, self.first = self.first, None
        return None if first is None else first.get("body", b"")

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            # Rendered now: the layers further out add their own headers (request id, quota, security headers)
            # to this same message on its way out, and a replay gets theirs afresh.
            status = message["status"]
            self.head = response_head(status, message.get("headers", ())) if status < 500 else None
        elif kind == "http.response.body" and self.head is not None:
            body = message.get("body", b"")
            step = self.step
            if message.get("more_body", False) or len(body) > step.max_response_bytes:
                self.head = None  # streaming or over the cap: not stored
            else:
                local = step.local
                if local is not None:
                    local.replace_now(self.key, local_record(self.print_, self.head, body), ttl_secs=step.ttl)
                    step.metrics.idempotency("stored")
                    self.done = True
                else:
                    self.done = await step._store(self.key, record_of(self.print_, self.head, body))
                self.head = None
        await self.send(message)


async def _replay(stored: Stored, send: Send) -> None:
    assert stored.status is not None
    await send({"type": "http.response.start", "status": stored.status, "headers": [*stored.headers, REPLAYED]})
    await send({"type": "http.response.body", "body": stored.body, "more_body": False})
