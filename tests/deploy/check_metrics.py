"""`make deploy-check`: deploy/'s dashboards and alert rules against real processes: every metric name they use is
exported on /metrics of a real `bastion run` of the deployed configuration (deploy/bastion/config.toml, with
distributed rate limits and revocations in a real Valkey and the broker on a real `nats-server -js`) and of a
real `mailrelay` in queue mode; and MailRelay-Accepted-At is what the docs say.

Not collected by `make test` (starting the two programs takes several seconds); .ci/run runs it. The fixtures are
the end-to-end suites' (tests/deploy/conftest.py).
"""

from __future__ import annotations

import re
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from bastion.testing import TokenMinter
from bastion_core.testing import DevCA, free_port
from mailrelay.testing import RecordedRequest, WebhookReceiver
from tests.conftest import REPO, BastionProcess
from tests.deploy.promql import exported_names, used_names
from tests.e2e.mailrelay.support import RelayProcess, read_dead_letters, send_message
from tests.nats_server import NatsServer


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[NatsServer]:
    """A NATS server of this test's own: the deployed config declares the stream DOCUMENTS on `documents.>`."""
    directory = tmp_path / "nats"
    directory.mkdir()
    server = NatsServer(directory).start()
    try:
        yield server
    finally:
        server.stop()


def test_every_metric_the_dashboard_and_the_rules_use_is_exported(
    bastion_process: Callable[..., BastionProcess],
    key_env: dict[str, str],
    minter: TokenMinter,
    valkey_url: str,
    own_nats: NatsServer,
) -> None:
    env = {
        **key_env,
        "SERVICE_POLICY_POLICY_PATH": str(REPO / "examples" / "documents_api" / "policies.cedar"),
        "SERVICE_CACHE_STORE_URL": valkey_url,
        "SERVICE_BROKER_URL": own_nats.url,
    }
    service = bastion_process("examples.documents_api:service", "--config", "deploy/bastion/config.toml", env=env)
    token = minter.mint(sub="alice", roles=["user"])
    listed = httpx.get(service.url + "/api/v2/documents", headers={"authorization": f"Bearer {token}"}, timeout=10)
    assert listed.status_code == 200
    assert httpx.get(service.url + "/ready", timeout=10).status_code == 200
    response = httpx.get(service.url + "/metrics", timeout=10)
    assert response.status_code == 200
    assert sorted(used_names("bastion") - exported_names(response.text) - TLS_METRICS) == []


TLS_METRICS = {"bastion_tls_certificate_expiry_seconds", "bastion_tls_reloads_total"}
"""Exported where Bastion terminates TLS (the deployed configuration leaves it to the ingress)."""


def test_the_certificate_metrics_the_rules_use_are_exported_where_bastion_serves_tls(
    bastion_process: Callable[..., BastionProcess], key_env: dict[str, str], tmp_path: Path
) -> None:
    ca = DevCA()
    ca.issue("localhost", dns=("localhost",), ips=("127.0.0.1",), server=True, client=False).write(tmp_path, "server")
    env = {
        **key_env,
        "SERVICE_TOKEN_ENABLED": "false",
        "SERVICE_POLICY_ENABLED": "false",
        "SERVICE_TLS_CERT_PATH": str(tmp_path / "server.pem"),
        "SERVICE_TLS_KEY_PATH": str(tmp_path / "server-key.pem"),
    }
    service = bastion_process("examples.documents_api:service", env=env, wait=False)
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    deadline = time.monotonic() + 30
    while True:
        assert service.proc.poll() is None, service.output()
        try:
            response = httpx.get(f"https://127.0.0.1:{service.port}/metrics", verify=context, timeout=2)
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, service.output()
            time.sleep(0.1)
    assert response.status_code == 200
    used = used_names("bastion") & TLS_METRICS
    assert used == TLS_METRICS
    assert sorted(used - exported_names(response.text)) == []


def refuse(request: RecordedRequest) -> int:
    return 422


def test_every_metric_the_dashboard_and_the_rules_use_is_exported_and_accepted_at_is_unix_seconds(
    queue_relay: Callable[..., RelayProcess],
    own_webhook: WebhookReceiver,
    nats_server: NatsServer,
    stream_name: str,
) -> None:
    own_webhook.answer_with(refuse)
    port = free_port()
    relay = queue_relay(nats_server.url, stream_name, METRICS_PORT=str(port))
    before = time.time()
    assert send_message(relay, "refused")[0] == 250
    after = time.time()
    (letter,) = read_dead_letters(nats_server.url, stream_name, 1)
    accepted_at = (letter.headers or {})["MailRelay-Accepted-At"]
    assert re.fullmatch(r"\d{10}\.\d{3}", accepted_at), accepted_at  # docs/mailrelay.md: seconds, three decimals
    assert before - 0.001 <= float(accepted_at) <= after + 0.001

    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert response.status_code == 200
    assert sorted(used_names("mailrelay") - exported_names(response.text)) == []
