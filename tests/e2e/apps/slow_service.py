"""A tiny service for process-level tests: a slow endpoint (for draining) and a failing one."""

import asyncio

import structlog

from bastion import Service

log = structlog.get_logger("slow_service")
service = Service("slow-service", version="0.0.1")
v1 = service.version(1)


@v1.get("/slow")
async def slow(seconds: float = 1.0) -> dict[str, float]:
    log.info("slow_request_started", seconds=seconds)
    await asyncio.sleep(seconds)
    return {"slept": seconds}


@v1.get("/boom")
async def boom() -> None:
    raise RuntimeError("secret internal detail")
