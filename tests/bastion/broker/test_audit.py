"""Audit events to the broker: received by a plain subscriber with the documented schema; never in the way."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from nats.aio.client import Client
from structlog.testing import capture_logs

from bastion import BastionApp, Service, load_settings
from bastion._audit import AuditEvent, Severity
from bastion.broker._audit_sink import BrokerAuditSink
from tests.bastion.broker.conftest import client_for, eventually, listen
from tests.conftest import TOKEN_OFF, running
from tests.nats_server import NatsServer

POLICIES = """
permit(principal, action == Action::"GET /api/v1/open", resource);
"""
SCHEMA = [
    "event_id",
    "timestamp",
    "kind",
    "severity",
    "service",
    "subject",
    "user_agent",
    "request_id",
    "client_ip",
    "method",
    "route",
    "details",
]


def audited_app(name: str, url: str, tmp_path: Path, **environ: str) -> BastionApp:
    policies = tmp_path / "policies.cedar"
    policies.write_text(POLICIES)
    service = Service(name)
    v1 = service.version(1)

    @v1.get("/open")
    async def open_route() -> dict[str, bool]:
        return {"open": True}

    @v1.get("/secret/{item}")
    async def secret(item: str) -> dict[str, str]:
        return {"item": item}

    settings = load_settings(
        environ={
            **TOKEN_OFF,
            "SERVICE_BROKER_URL": url,
            "SERVICE_BROKER_LAZY_INIT": "false",
            "SERVICE_POLICY_POLICY_PATH": str(policies),
            "SERVICE_RATE_LIMIT_PER_IP_RPM": "2",
            **environ,
        }
    )
    return service.build(settings)


@pytest.fixture
def service_name(uid: str) -> str:
    return f"audit-{uid}"


async def test_a_policy_denial_is_published_with_the_documented_schema(
    nats_server: NatsServer, nc: Client, tmp_path: Path, service_name: str
) -> None:
    inbox = await listen(nc, f"bastion.audit.{service_name}.>")
    app = audited_app(service_name, nats_server.url, tmp_path)
    async with running(app), client_for(app) as client:
        denied = await client.get(
            "/api/v1/secret/42",
            headers={"user-agent": "probe/1.0", "x-request-id": "req-7", "x-forwarded-for": "203.0.113.9, 10.0.0.1"},
        )
        assert denied.status_code == 403
        await eventually(lambda: len(inbox.messages) == 1, what="the audit event")
    [message] = inbox.messages
    assert message.subject == f"bastion.audit.{service_name}.AuthPermissionDenied"
    event = json.loads(message.data)
    assert list(event) == SCHEMA
    assert re.fullmatch(r"[0-9a-f]{32}", event.pop("event_id"))
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", event.pop("timestamp"))
    assert event == {
        "kind": "AuthPermissionDenied",
        "severity": "warning",
        "service": service_name,
        "subject": None,
        "user_agent": "probe/1.0",
        "request_id": "req-7",
        "client_ip": "203.0.113.9",
        "method": "GET",
        "route": "/api/v1/secret/{item}",
        "details": {"action": "GET /api/v1/secret/{item}"},
    }


async def test_a_rate_limit_rejection_is_published_as_http_request_denied(
    nats_server: NatsServer, nc: Client, tmp_path: Path, service_name: str
) -> None:
    inbox = await listen(nc, f"bastion.audit.{service_name}.>")
    app = audited_app(service_name, nats_server.url, tmp_path)
    async with running(app), client_for(app) as client:
        statuses = [(await client.get("/api/v1/open")).status_code for _ in range(3)]
        await eventually(lambda: len(inbox.messages) == 1, what="the audit event")
    assert statuses == [200, 200, 429]
    [message] = inbox.messages
    event = json.loads(message.data)
    assert (message.subject, event["kind"], event["severity"], event["route"], event["client_ip"]) == (
        f"bastion.audit.{service_name}.HttpRequestDenied",
        "HttpRequestDenied",
        "warning",
        "/api/v1/open",
        "127.0.0.1",
    )
    assert event["details"] == {
        "event_type": "http.request.denied",
        "method": "GET",
        "path": "/api/v1/open",
        "bucket": "rate_limit:ip:127.0.0.1:60",
        "limit": 2,
        "retry_after": event["details"]["retry_after"],  # the seconds left in the window: the clock decides
    }
    assert 1 <= event["details"]["retry_after"] <= 60


async def test_audit_auth_events_false_publishes_nothing(
    nats_server: NatsServer, nc: Client, tmp_path: Path, service_name: str
) -> None:
    inbox = await listen(nc, f"bastion.audit.{service_name}.>")
    app = audited_app(service_name, nats_server.url, tmp_path, SERVICE_AUDIT_AUDIT_AUTH_EVENTS="false")
    async with running(app), client_for(app) as client:
        assert (await client.get("/api/v1/secret/1")).status_code == 403
        assert app.broker is not None
        await app.broker.publish(f"bastion.audit.{service_name}.marker", b"")  # after anything the request sent
        await eventually(lambda: len(inbox.messages) == 1, what="the marker")
    assert [message.subject for message in inbox.messages] == [f"bastion.audit.{service_name}.marker"]


async def test_with_the_broker_down_requests_are_answered_and_drops_counted(tmp_path: Path, service_name: str) -> None:
    down = NatsServer(tmp_path)  # never started
    app = audited_app(service_name, down.url, tmp_path, SERVICE_BROKER_LAZY_INIT="true")
    with capture_logs() as logs:
        async with running(app), client_for(app) as client:
            statuses = [(await client.get("/api/v1/secret/1")).status_code for _ in range(2)]
            assert app.audit_sink is not None
            await eventually(lambda: app.audit_sink is not None and app.audit_sink.dropped == 2, what="two drops")
    assert statuses == [403, 403]
    assert [entry["event"] for entry in logs].count("AuthPermissionDenied") == 2  # the log sink still has them
    [first_drop] = [entry for entry in logs if entry["event"] == "audit_events_dropped"]
    assert (first_drop["dropped"], first_drop["reason"]) == (1, "broker unavailable")


async def test_a_full_buffer_drops_instead_of_waiting() -> None:
    sink = BrokerAuditSink(broker=None, prefix="bastion.audit", service="svc", buffer=1)  # type: ignore[arg-type]
    event = AuditEvent(
        name="AuthPermissionDenied",
        severity=Severity.WARNING,
        subject=None,
        user_agent=None,
        request_id=None,
        client_ip="127.0.0.1",
    )
    await sink.emit(event)
    await sink.emit(event)
    assert (sink.queue.qsize(), sink.dropped) == (1, 1)
