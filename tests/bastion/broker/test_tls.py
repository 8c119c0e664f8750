"""The broker over TLS with client authentication: a real nats-server with ``--tlsverify`` and the client
certificate from ``broker.tls_cert_path`` / ``tls_key_path``, re-read when the files change."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bastion.errors import ConfigError
from bastion_core.testing import DevCA
from tests.bastion.broker.conftest import broker_settings, eventually, worker
from tests.conftest import running
from tests.nats_server import NatsServer

QUICK = {"SERVICE_BROKER_RETRY_DELAY_SECS": "0", "SERVICE_BROKER_CONNECT_TIMEOUT_SECS": "2"}


@dataclass
class TlsNats:
    server: NatsServer
    directory: Path
    ca: DevCA

    @property
    def url(self) -> str:
        return f"tls://127.0.0.1:{self.server.port}"

    def environ(self, client: str | None) -> dict[str, str]:
        environ = {**QUICK, "SERVICE_BROKER_LAZY_INIT": "false", "SERVICE_BROKER_MAX_RETRIES": "0"}
        environ["SERVICE_BROKER_TLS_CA_PATH"] = str(self.directory / "ca.pem")
        if client is not None:
            environ["SERVICE_BROKER_TLS_CERT_PATH"] = str(self.directory / f"{client}.pem")
            environ["SERVICE_BROKER_TLS_KEY_PATH"] = str(self.directory / f"{client}-key.pem")
        return environ


@pytest.fixture(scope="module")
def tls_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsNats]:
    directory = tmp_path_factory.mktemp("nats-tls")
    ca = DevCA()
    ca.write(directory)
    cert, key = ca.issue("nats", dns=("localhost",), ips=("127.0.0.1",), server=True, client=False).write(
        directory, "nats"
    )
    ca.issue("orders", spiffe="spiffe://example.test/orders").write(directory, "orders")
    DevCA("another CA").issue("orders").write(directory, "foreign")
    args = ["--tls", "--tlscert", str(cert), "--tlskey", str(key), "--tlscacert", str(directory / "ca.pem")]
    server = NatsServer(directory, args=[*args, "--tlsverify"]).start()
    try:
        yield TlsNats(server, directory, ca)
    finally:
        server.stop()


async def test_client_certificate_connects_to_nats_with_tls_client_auth(tls_nats: TlsNats) -> None:
    app = worker().build(broker_settings(tls_nats.url, **tls_nats.environ("orders")))
    async with running(app):
        assert app.broker is not None and app.broker.connected


@pytest.mark.parametrize("client", [None, "foreign"], ids=["no-certificate", "another-ca"])
async def test_nats_refuses_a_connection_without_a_good_client_certificate(
    tls_nats: TlsNats, client: str | None
) -> None:
    app = worker().build(broker_settings(tls_nats.url, **tls_nats.environ(client)))
    with pytest.raises(AssertionError, match="cannot connect after 1 attempt"):
        async with running(app):
            pass


def test_a_mismatched_client_pair_is_a_start_up_error(tls_nats: TlsNats) -> None:
    environ = tls_nats.environ("orders")
    environ["SERVICE_BROKER_TLS_KEY_PATH"] = str(tls_nats.directory / "foreign-key.pem")
    with pytest.raises(ConfigError, match=r"^broker\.tls_\*_path: key .* does not match its certificate$"):
        worker().build(broker_settings(tls_nats.url, **environ))


async def test_a_rotated_client_certificate_is_used_for_the_next_connection(tls_nats: TlsNats) -> None:
    app = worker().build(broker_settings(tls_nats.url, **tls_nats.environ("orders")))
    async with running(app):
        assert app.broker is not None
        tls = app.broker.connection.tls
        assert tls is not None
        tls_nats.ca.issue("orders", spiffe="spiffe://example.test/orders", valid_days=90).write(
            tls_nats.directory, "orders"
        )
        assert tls.reload() is not None
        assert (tls.expires_in() or 0) > 89 * 86400
        client = app.broker.connection.nc
        assert client is not None
        await client.flush(timeout=5)
        tls_nats.server.kill()
        tls_nats.server.start()  # the reconnect handshakes with the new pair, from the same context
        await eventually(lambda: client.stats["reconnects"] == 1 and client.is_connected, what="reconnected")
        await client.flush(timeout=10)
        assert app.broker.connected
