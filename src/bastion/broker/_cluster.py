"""Beyond one instance: a policy reload or a token revocation on one instance is announced on the broker, and
every other instance of the service applies it.

Subjects: ``bastion.control.<service>.policy_reloaded`` (``{"instance", "digest"}``) and
``bastion.control.<service>.token_revoked`` (``{"instance", "jti", "reason", "exp"}``). An instance ignores its
own announcements; a reload whose digest it already has is a no-op.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from bastion.broker._audit_sink import subject_token
from bastion.broker._handlers import BoundHandler, BrokerMessage, Publisher
from bastion.broker._specs import SubscriberSpec
from bastion.errors import BrokerUnavailable

log = structlog.get_logger("bastion.broker")

CONTROL_PREFIX = "bastion.control"
OnReload = Callable[[str], Awaitable[None]]
OnRevoke = Callable[[str, str, float], Awaitable[None]]


class ClusterSync:
    def __init__(self, *, service: str, on_reload: OnReload, on_revoke: OnRevoke) -> None:
        self.instance = os.urandom(8).hex()
        self.prefix = f"{CONTROL_PREFIX}.{subject_token(service)}"
        self.on_reload = on_reload
        self.on_revoke = on_revoke
        self.broker: Publisher | None = None

    def subscriber(self) -> SubscriberSpec:
        """The subscription every instance runs (no queue group: each instance must apply every announcement)."""
        return SubscriberSpec(subject=f"{self.prefix}.>", handler=BoundHandler.of(self._received))

    async def _received(self, message: BrokerMessage) -> None:
        announcement: dict[str, Any] = json.loads(message.data)
        if announcement.get("instance") == self.instance:
            return
        kind = message.subject.rsplit(".", 1)[-1]
        if kind == "policy_reloaded":
            await self.on_reload(str(announcement.get("digest", "")))
        elif kind == "token_revoked":
            await self.on_revoke(
                str(announcement["jti"]), str(announcement.get("reason", "")), float(announcement["exp"])
            )
        log.info("cluster_announcement_applied", kind=kind, origin=announcement.get("instance"))

    async def announce_reload(self, digest: str) -> None:
        await self._announce("policy_reloaded", {"digest": digest})

    async def announce_revocation(self, jti: str, reason: str, expires_at: float) -> None:
        await self._announce("token_revoked", {"jti": jti, "reason": reason, "exp": expires_at})

    async def _announce(self, kind: str, body: dict[str, Any]) -> None:
        if self.broker is None:
            return
        try:
            await self.broker.publish(f"{self.prefix}.{kind}", {"instance": self.instance, **body})
        except BrokerUnavailable:
            # This instance applied it; the others apply it when they reload or restart. Never fail the caller.
            log.warning("cluster_announcement_failed", kind=kind, reason="broker unavailable")
