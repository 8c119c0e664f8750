"""``GET /health`` and ``GET /ready``: unversioned, always public; readiness runs dependency checks concurrently."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from bastion._responses import send_json
from bastion.types import Receive, Scope, Send

HEALTH_PATH = "/health"
READY_PATH = "/ready"
ALWAYS_PUBLIC = frozenset({HEALTH_PATH, READY_PATH})
"""The framework's own endpoints: no token, no rate limit, no policy, whatever the configuration."""
MAX_MESSAGE_CHARS = 200

Check = Callable[[], Awaitable[object]]
log = structlog.get_logger("bastion.health")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadinessCheck:
    """A named dependency check: healthy unless it raises, times out or returns ``False``."""

    name: str
    check: Check
    optional: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckResult:
    name: str
    healthy: bool
    optional: bool
    message: str | None = None

    def body(self) -> dict[str, Any]:
        return {"healthy": self.healthy, **({"message": self.message} if self.message else {})}


async def _run(check: ReadinessCheck, deadline: float) -> CheckResult:
    try:
        async with asyncio.timeout(deadline):
            outcome = await check.check()
    except TimeoutError:
        return CheckResult(
            name=check.name, healthy=False, optional=check.optional, message=f"timed out after {deadline:g}s"
        )
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}"[:MAX_MESSAGE_CHARS]
        return CheckResult(name=check.name, healthy=False, optional=check.optional, message=message)
    healthy = outcome is not False
    return CheckResult(
        name=check.name, healthy=healthy, optional=check.optional, message=None if healthy else "check failed"
    )


class Health:
    """The two built-in endpoints as raw ASGI apps (no routing or validation cost)."""

    def __init__(self, *, service: str, version: str, checks: Sequence[ReadinessCheck], timeout: float) -> None:
        self.service = service
        self.checks = list(checks)
        self.timeout = timeout
        self._health_body = {"status": "healthy", "service": service, "version": version}

    async def readiness(self) -> tuple[bool, list[CheckResult]]:
        """Run every check concurrently under the deadline; ready unless a non-optional one failed."""
        results = list(await asyncio.gather(*(_run(check, self.timeout) for check in self.checks)))
        ready = all(result.healthy or result.optional for result in results)
        for result in results:
            if not result.healthy:
                log.warning(
                    "dependency_unhealthy",
                    dependency=result.name,
                    optional=result.optional,
                    message=result.message,
                )
        return ready, results

    async def health(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, self._health_body, head=scope.get("method") == "HEAD")

    async def ready(self, scope: Scope, receive: Receive, send: Send) -> None:
        ready, results = await self.readiness()
        payload = {
            "ready": ready,
            "service": self.service,
            "dependencies": {result.name: result.body() for result in results},
        }
        await send_json(send, 200 if ready else 503, payload, head=scope.get("method") == "HEAD")
