"""Audit events (``AuthPermissionDenied``, ``HttpRequestDenied``) to the log and, with a broker, to the broker."""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from bastion._client_ip import forwarded_ip, peer_ip
from bastion.config import AuditSettings
from bastion.types import SCOPE_CLAIMS, SCOPE_REQUEST_ID, SCOPE_ROUTE, Scope

log = structlog.get_logger("bastion.audit")


class Severity(enum.Enum):
    INFO = "info"
    WARNING = "warning"


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditEvent:
    """One audit record: what happened, to whom, from where."""

    name: str
    severity: Severity
    subject: str | None
    user_agent: str | None
    request_id: str | None
    client_ip: str
    method: str | None = None
    route: str | None = None
    """The route template (``/api/v2/documents/{user_id}/{doc_id}``), the path when no route matched, or the
    gRPC method."""
    event_id: str = field(default_factory=lambda: os.urandom(16).hex())
    timestamp: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="milliseconds"))
    details: dict[str, Any] = field(default_factory=dict)

    def document(self, service: str) -> dict[str, Any]:
        """The event as published to the broker (docs/broker.md, "Audit events")."""
        return {
            "event_id": self.event_id,
            "timestamp": self.timestamp.replace("+00:00", "Z"),
            "kind": self.name,
            "severity": self.severity.value,
            "service": service,
            "subject": self.subject,
            "user_agent": self.user_agent,
            "request_id": self.request_id,
            "client_ip": self.client_ip,
            "method": self.method,
            "route": self.route,
            "details": self.details,
        }


class AuditSink(Protocol):
    """Where audit events go: the log, and the broker when one is configured (``bastion.broker``)."""

    async def emit(self, event: AuditEvent) -> None: ...


class LogAuditSink:
    """Write each event as a structured log line named after the event."""

    async def emit(self, event: AuditEvent) -> None:
        fields = asdict(event)
        fields.pop("name")
        fields["severity"] = event.severity.value
        level = log.warning if event.severity is Severity.WARNING else log.info
        level(event.name, audit=True, **fields)


def event_from_scope(name: str, severity: Severity, scope: Scope, **details: Any) -> AuditEvent:
    """An event with the spec's fields read from the request: subject, user agent, request id, client IP.

    The client IP is the first X-Forwarded-For entry or X-Real-IP when present (as the spec records it),
    else the peer address.
    """
    claims = scope.get(SCOPE_CLAIMS)
    user_agent = next((v.decode("latin-1")[:512] for k, v in scope.get("headers", ()) if k == b"user-agent"), None)
    route = scope.get(SCOPE_ROUTE)
    return AuditEvent(
        name=name,
        severity=severity,
        subject=getattr(claims, "sub", None),
        user_agent=user_agent,
        request_id=scope.get(SCOPE_REQUEST_ID),
        client_ip=forwarded_ip(scope) or peer_ip(scope),
        method=scope.get("method", "GET"),
        route=route.template if route is not None else scope.get("path"),
        details=details,
    )


class Auditor:
    """Send auth-related events to every sink unless ``audit.enabled`` or ``audit.audit_auth_events`` is off."""

    def __init__(self, settings: AuditSettings, sinks: Sequence[AuditSink] = ()) -> None:
        self.enabled = settings.enabled and settings.audit_auth_events
        self.sinks: list[AuditSink] = list(sinks) or [LogAuditSink()]

    async def auth_event(self, name: str, scope: Scope, **details: Any) -> None:
        if not self.enabled:
            return
        event = event_from_scope(name, Severity.WARNING, scope, **details)
        for sink in self.sinks:
            try:
                await sink.emit(event)
            except Exception as exc:  # an audit sink must never turn a 403 into a 500
                log.error("audit_sink_failed", sink=type(sink).__name__, error=f"{type(exc).__name__}: {exc}")
