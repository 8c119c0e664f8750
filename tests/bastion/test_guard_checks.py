"""How the adapters call a guard's check: a method's gRPC exemption decided once (bounded), a guard's check
awaited only when it returns something to await."""

from __future__ import annotations

import asyncio

from bastion._guard import (
    GRPC_BUILT_IN,
    MAX_GRPC_EXEMPTION_METHODS,
    Exemptions,
    GuardLayer,
    Outcome,
    check_now_of,
    grpc_check,
)
from bastion.types import Message, Receive, Scope, Send


class CountingExemptions:
    """Exemptions that count how often they are asked."""

    def __init__(self) -> None:
        self.asked = 0
        self.rule = Exemptions(public_paths=("/pkg.Public",))

    def skips(self, scope: Scope) -> bool:
        self.asked += 1
        return self.rule.skips(scope)


class CountingGuard:
    def __init__(self) -> None:
        self.exemptions = CountingExemptions()
        self.checked: list[str] = []

    async def check(self, scope: Scope) -> Outcome | None:
        self.checked.append(scope["path"])
        return None


def grpc_scope(method: str) -> Scope:
    return {"type": "grpc", "method": "POST", "path": method, "headers": []}


async def run(result: object) -> object:
    return await result if asyncio.iscoroutine(result) else result


def test_a_grpc_methods_exemption_is_decided_once() -> None:
    guard = CountingGuard()
    hook = grpc_check(guard)
    for _ in range(3):
        assert asyncio.run(run(hook(grpc_scope("/pkg.Docs/Get")))) is None
        assert hook(grpc_scope("/pkg.Public/Ping")) is None
        assert hook(grpc_scope(GRPC_BUILT_IN[0] + "Check")) is None
    assert guard.exemptions.asked == 3
    assert guard.checked == ["/pkg.Docs/Get"] * 3


def test_exemptions_of_methods_past_the_bound_are_decided_per_call() -> None:
    guard = CountingGuard()
    hook = grpc_check(guard)
    methods = [f"/pkg.Docs/M{number}" for number in range(MAX_GRPC_EXEMPTION_METHODS + 2)]
    for method in methods:
        asyncio.run(run(hook(grpc_scope(method))))
    for method in (methods[0], methods[-1], "/pkg.Public/Ping", "/pkg.Public/Ping"):
        asyncio.run(run(hook(grpc_scope(method))))
    # the first MAX methods are remembered; the last two, and every method after them, are asked each call
    assert guard.exemptions.asked == MAX_GRPC_EXEMPTION_METHODS + 2 + 3
    assert guard.checked == [*methods, methods[0], methods[-1]]


class FutureGuard:
    """An operator's guard whose ``check`` is a plain function returning an awaitable (not a coroutine)."""

    exemptions = Exemptions()

    def __init__(self) -> None:
        self.checked = 0

    def check(self, scope: Scope) -> asyncio.Future[Outcome | None]:
        self.checked += 1
        future: asyncio.Future[Outcome | None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


def test_a_guard_without_check_now_is_awaited_whatever_awaitable_it_returns() -> None:
    guard = FutureGuard()
    reached: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(scope["path"])

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        pass

    layer = GuardLayer(app, guard=guard)
    asyncio.run(layer({"type": "http", "path": "/x", "headers": []}, receive, send))
    assert (guard.checked, reached) == (1, ["/x"])
    assert asyncio.run(run(check_now_of(guard)({"type": "grpc", "path": "/x", "headers": []}))) is None
    assert guard.checked == 2
