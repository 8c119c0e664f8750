"""Outbound: bulkhead, then breaker, then the call, under httpx against a real local HTTP server."""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import Iterator

import httpx
import pytest

from bastion_core import (
    BreakerState,
    Bulkhead,
    BulkheadFullError,
    CircuitBreaker,
    CircuitOpenError,
    Guard,
    ResilientTransport,
)
from bastion_core.testing import FakeClock, free_port


class Dependency:
    """A real HTTP server on loopback answering ``status`` to every request (changeable), counting requests."""

    def __init__(self) -> None:
        self.status = 200
        self.requests = 0
        dependency = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                dependency.requests += 1
                self.send_response(dependency.status)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def dependency() -> Iterator[Dependency]:
    server = Dependency()
    yield server
    server.close()


def guarded_client(breaker: CircuitBreaker | None = None, bulkhead: Bulkhead | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=ResilientTransport(Guard(breaker=breaker, bulkhead=bulkhead)), timeout=5)


async def test_5xx_responses_trip_the_breaker_and_then_no_request_is_made(dependency: Dependency) -> None:
    clock = FakeClock(0.0)
    breaker = CircuitBreaker("payments", min_requests=4, wait_secs=10, clock=clock)
    async with guarded_client(breaker) as client:
        dependency.status = 503
        statuses = [(await client.get(dependency.url)).status_code for _ in range(4)]
        assert statuses == [503, 503, 503, 503]  # the 5xx still reaches the caller
        assert breaker.state is BreakerState.OPEN
        with pytest.raises(CircuitOpenError):
            await client.get(dependency.url)
        assert dependency.requests == 4  # the rejected call never left the process
        dependency.status = 200
        clock.advance(10)
        assert (await client.get(dependency.url)).status_code == 200  # the Half-Open test request
        assert breaker.state is BreakerState.CLOSED


async def test_4xx_responses_are_successes(dependency: Dependency) -> None:
    breaker = CircuitBreaker("payments", min_requests=2)
    dependency.status = 404
    async with guarded_client(breaker) as client:
        for _ in range(5):
            await client.get(dependency.url)
    assert (breaker.state, breaker.failure_rate) == (BreakerState.CLOSED, 0.0)


async def test_connection_errors_count_as_failures() -> None:
    breaker = CircuitBreaker("payments", min_requests=2)
    async with guarded_client(breaker) as client:
        for _ in range(2):
            with pytest.raises(httpx.ConnectError):
                await client.get(f"http://127.0.0.1:{free_port()}/")
    assert breaker.state is BreakerState.OPEN


async def test_the_bulkhead_sits_outside_the_breaker(dependency: Dependency) -> None:
    """A full bulkhead refuses before the breaker is asked, so a refusal never counts against the dependency."""
    breaker = CircuitBreaker("payments", min_requests=1)
    bulkhead = Bulkhead("payments", max_concurrent=1, max_wait=0.05)
    guard = Guard(breaker=breaker, bulkhead=bulkhead)
    release = asyncio.Event()

    async def slow_call() -> None:
        async with guard.call():
            await release.wait()

    holder = asyncio.create_task(slow_call())
    await asyncio.sleep(0)
    with pytest.raises(BulkheadFullError):
        async with guard.call():
            raise AssertionError("not reached")
    release.set()
    await holder
    assert (breaker.state, breaker.failure_rate, bulkhead.in_use) == (BreakerState.CLOSED, 0.0, 0)


async def test_the_decorator_guards_any_coroutine() -> None:
    breaker = CircuitBreaker("db", min_requests=2)
    guard = Guard(breaker=breaker)

    @guard
    async def query(fail: bool) -> str:
        if fail:
            raise ConnectionError("db down")
        return "rows"

    assert await query(False) == "rows"
    with pytest.raises(ConnectionError):
        await query(True)
    with pytest.raises(ConnectionError):
        await query(True)
    assert breaker.state is BreakerState.OPEN
    with pytest.raises(CircuitOpenError):
        await query(False)


async def test_is_failure_decides_which_exceptions_count() -> None:
    breaker = CircuitBreaker("db", min_requests=1)
    guard = Guard(breaker=breaker, is_failure=lambda exc: not isinstance(exc, KeyError))
    with pytest.raises(KeyError):
        async with guard.call():
            raise KeyError("not found is the caller's problem")
    assert breaker.state is BreakerState.CLOSED


async def test_the_guards_readiness_check_follows_its_breaker_and_is_ready_without_one() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker("payments", min_requests=1, wait_secs=12, clock=clock)
    guard = Guard(breaker=breaker)
    await guard.ready()
    with pytest.raises(RuntimeError):
        async with guard.call():
            raise RuntimeError("down")
    with pytest.raises(CircuitOpenError, match="circuit 'payments' is open; retry in 12s"):
        await guard.ready()
    await Guard(breaker=None, bulkhead=Bulkhead("payments", max_concurrent=1)).ready()  # circuit_breaker_enabled off
