"""The connection: lazy and eager start-up, readiness through outages, credentials, malformed URLs, drain."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from bastion import load_settings
from bastion.errors import BrokerUnavailable, ConfigError
from tests.bastion.broker.conftest import broker_settings, client_for, eventually, worker
from tests.conftest import TOKEN_OFF, running
from tests.nats_server import NatsServer

QUICK = {"SERVICE_BROKER_RETRY_DELAY_SECS": "0", "SERVICE_BROKER_CONNECT_TIMEOUT_SECS": "1"}


def not_connected(service: str = "shop") -> dict[str, object]:
    return {
        "ready": False,
        "service": service,
        "dependencies": {"broker": {"healthy": False, "message": "BrokerUnavailable: broker not connected"}},
    }


def connected(service: str = "shop") -> dict[str, object]:
    return {"ready": True, "service": service, "dependencies": {"broker": {"healthy": True}}}


async def test_lazy_start_without_the_broker_then_ready_once_it_is_up(tmp_path: Path) -> None:
    server = NatsServer(tmp_path)  # its port, not yet listening
    app = worker().build(broker_settings(server.url, **QUICK))
    try:
        async with running(app), client_for(app) as client:
            down = await client.get("/ready")
            assert (down.status_code, down.json()) == (503, not_connected())
            assert app.broker is not None
            with pytest.raises(BrokerUnavailable):
                await app.broker.publish("orders.created", b"{}")
            server.start()
            await eventually(lambda: app.broker is not None and app.broker.connected, what="connected")
            up = await client.get("/ready")
            assert (up.status_code, up.json()) == (200, connected())
    finally:
        server.stop()


async def test_ready_follows_an_outage_and_the_reconnect(own_nats_server: NatsServer) -> None:
    app = worker().build(broker_settings(own_nats_server.url, SERVICE_BROKER_LAZY_INIT="false", **QUICK))
    async with running(app), client_for(app) as client:
        assert (await client.get("/ready")).status_code == 200
        own_nats_server.kill()
        await eventually(lambda: app.broker is not None and not app.broker.connected, what="disconnected")
        assert (await client.get("/ready")).status_code == 503
        own_nats_server.start()
        await eventually(lambda: app.broker is not None and app.broker.connected, what="reconnected")
        assert (await client.get("/ready")).status_code == 200


async def test_an_optional_broker_shows_unhealthy_but_keeps_ready(tmp_path: Path) -> None:
    server = NatsServer(tmp_path)
    app = worker().build(broker_settings(server.url, SERVICE_BROKER_OPTIONAL="true", **QUICK))
    async with running(app), client_for(app) as client:
        response = await client.get("/ready")
    assert (response.status_code, response.json()) == (200, {**not_connected(), "ready": True})


async def test_eager_start_fails_after_the_retries_with_how_to_fix_it(tmp_path: Path) -> None:
    server = NatsServer(tmp_path)
    app = worker().build(
        broker_settings(server.url, SERVICE_BROKER_LAZY_INIT="false", SERVICE_BROKER_MAX_RETRIES="2", **QUICK)
    )
    with capture_logs() as logs, pytest.raises(AssertionError) as failed:
        async with running(app):
            pass
    message = str(failed.value)
    assert message.startswith(f"ConfigError: broker.url {server.url}: cannot connect after 3 attempts (")
    assert message.endswith("); start NATS, fix the URL, or set broker.lazy_init = true to start without it")
    assert [entry["attempt"] for entry in logs if entry["event"] == "broker_connect_failed"] == [1, 2]


async def test_a_server_without_jetstream_is_a_clear_start_up_error(tmp_path: Path) -> None:
    server = NatsServer(tmp_path, jetstream=False).start()
    try:
        service = worker()
        service.stream("ORDERS", subjects=["orders.>"])
        app = service.build(broker_settings(server.url, SERVICE_BROKER_LAZY_INIT="false", **QUICK))
        with pytest.raises(AssertionError) as failed:
            async with running(app):
                pass
    finally:
        server.stop()
    assert str(failed.value) == (
        f"ConfigError: broker.url {server.url}: JetStream is not enabled on this NATS server (start it with -js)"
    )


class TestCredentials:
    @pytest.fixture
    def guarded(self, tmp_path: Path) -> Iterator[NatsServer]:
        server = NatsServer(tmp_path, args=["--user", "app", "--pass", "right-horse"]).start()
        try:
            yield server
        finally:
            server.stop()

    async def test_right_credentials_connect(self, guarded: NatsServer) -> None:
        url = f"nats://app:right-horse@127.0.0.1:{guarded.port}"
        app = worker().build(broker_settings(url, SERVICE_BROKER_LAZY_INIT="false", **QUICK))
        async with running(app):
            assert app.broker is not None and app.broker.connected

    async def test_wrong_credentials_fail_without_showing_the_password(self, guarded: NatsServer) -> None:
        url = f"nats://app:wrong-horse@127.0.0.1:{guarded.port}"
        app = worker().build(
            broker_settings(url, SERVICE_BROKER_LAZY_INIT="false", SERVICE_BROKER_MAX_RETRIES="0", **QUICK)
        )
        with capture_logs() as logs, pytest.raises(AssertionError) as failed:
            async with running(app):
                pass
        message = str(failed.value)
        assert message == (
            f"ConfigError: broker.url nats://app:***@127.0.0.1:{guarded.port}: cannot connect after 1 attempt "
            "(Error: nats: 'Authorization Violation'); check the user and password in broker.url"
        )
        assert "wrong-horse" not in repr(logs)

    async def test_the_posture_masks_the_password(self, guarded: NatsServer) -> None:
        url = f"nats://app:right-horse@127.0.0.1:{guarded.port},nats://app:right-horse@127.0.0.1:1"
        app = worker().build(broker_settings(url, **QUICK))
        assert app.posture().broker.fields() == {
            "enabled": True,
            "url": f"nats://app:***@127.0.0.1:{guarded.port},nats://app:***@127.0.0.1:1",
            "optional": False,
            "lazy_init": True,
        }


@pytest.mark.parametrize(
    "url",
    [
        "http://app:s3cret@127.0.0.1:4222",
        "nats://app:s3cret@127.0.0.1:4222/path",
        "nats://127.0.0.1:4222,,nats://127.0.0.1:4223",
        "127.0.0.1:4222",
        "nats://a b:4222",
    ],
)
def test_a_malformed_url_refuses_to_load_without_echoing_it(url: str) -> None:
    with pytest.raises(ConfigError) as failed:
        load_settings(environ={**TOKEN_OFF, "SERVICE_BROKER_URL": url})
    assert str(failed.value) == (
        "invalid configuration (embedded defaults): SERVICE_BROKER_URL=*** (broker.url): expected nats://host:port "
        "(comma-separated for a cluster, tls:// for TLS)"
    )


def test_the_environment_overrides_the_file(tmp_path: Path) -> None:
    config = tmp_path / "service.toml"
    config.write_text('[broker]\nurl = "nats://file-host:4222"\noptional = true\n')
    settings = load_settings(config, environ={**TOKEN_OFF, "SERVICE_BROKER_URL": "nats://env-host:4222"})
    assert settings.broker is not None and settings.broker.url is not None
    assert (settings.broker.url.get_secret_value(), settings.broker.optional) == ("nats://env-host:4222", True)


def test_enabled_false_turns_a_configured_broker_off(tmp_path: Path) -> None:
    app = worker().build(broker_settings("nats://127.0.0.1:4222", SERVICE_BROKER_ENABLED="false"))
    assert app.broker is None
    assert [check.name for check in app.health.checks] == []
