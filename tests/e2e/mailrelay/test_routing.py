"""Recipient routing and sender rules through the real `mailrelay` process: a routes file with two receivers (each
its own signing secret), the single-webhook pair as the default route, a Cedar sender policy with the DMARC verdict
from a real DNS server, and the start-up refusals."""

from __future__ import annotations

import json
import smtplib
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mailrelay._signing import verify_signature
from mailrelay.testing import WebhookReceiver, free_port
from tests.e2e.mailrelay.support import SECRET, RelayProcess, relay_command, relay_env
from tests.mailrelay.servers import DnsZone
from tests.nats_server import NatsServer

POLICY = """
@id("anyone")
permit (principal, action == Action::"Receive", resource);

@id("billing-only-aligned-partner")
forbid (principal, action, resource == Route::"billing")
unless { context.dmarc == "pass" && principal.aligned_domain == "partner.test" };

@id("no-executables")
forbid (principal, action, resource)
when { context.attachment_types.contains("application/x-msdownload") };

@id("loopback-only")
forbid (principal, action, resource)
unless { context.client_ip.isLoopback() && context.size < 100000 };
"""
DENY_TEXT = "Not accepted from you"


@pytest.fixture(scope="module")
def support() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as running:
        yield running


@pytest.fixture(scope="module")
def billing() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as running:
        yield running


@pytest.fixture(scope="module")
def default() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as running:
        yield running


@pytest.fixture(scope="module")
def routed(
    start_relay: Callable[..., RelayProcess],
    tmp_path_factory: pytest.TempPathFactory,
    support: WebhookReceiver,
    billing: WebhookReceiver,
    default: WebhookReceiver,
    dns_zone: DnsZone,
) -> RelayProcess:
    folder = tmp_path_factory.mktemp("routes")
    (folder / "routes.toml").write_text(
        f"""
[[route]]
name = "support"
patterns = ["support@example.test", "help+*@example.test"]
webhook_url = "{support.url}"
signing_secret = "support-secret"

[[route]]
name = "billing"
patterns = ["*@billing.test"]
webhook_url = "{billing.url}"
signing_secret = "billing-secret"
"""
    )
    (folder / "policy.cedar").write_text(POLICY)
    dns_zone.txt("_dmarc.partner.test", "v=DMARC1; p=reject")
    dns_zone.txt("partner.test", "v=spf1 ip4:127.0.0.1 -all")
    return start_relay(
        TARGET_EMAILS="inbox@example.test",
        WEBHOOK_URL=default.url,
        ROUTES_FILE=str(folder / "routes.toml"),
        SENDER_POLICY_FILE=str(folder / "policy.cedar"),
        SENDER_POLICY_DENY_TEXT=DENY_TEXT,
        DMARC_MODE="monitor",
        DNS_SERVERS=f"127.0.0.1:{dns_zone.port}",
        DNS_TIMEOUT="0.5",
    )


def message(author: str, to: str, extra: str = "") -> bytes:
    return f"From: <{author}>\r\nTo: {to}\r\nSubject: routed\r\n{extra}\r\nbody\r\n".encode()


def one_post(receiver: WebhookReceiver, secret: str) -> dict[str, object]:
    (request,) = receiver.wait_for(1)
    timestamp, signature = request.header("X-MailRelay-Timestamp"), request.header("X-MailRelay-Signature-256")
    assert timestamp is not None and signature is not None
    assert verify_signature(secret, timestamp=timestamp, signature=signature, body=request.body, now=time.time())
    payload: dict[str, object] = json.loads(request.body)
    receiver.requests.clear()
    return payload


@pytest.mark.parametrize(
    ("recipient", "route", "secret"),
    [
        pytest.param("Support@Example.test", "support", "support-secret", id="exact"),
        pytest.param("help+vip@example.test", "support", "support-secret", id="plus-family"),
        pytest.param("help@example.test", "support", "support-secret", id="plus-family-untagged"),
    ],
)
def test_each_form_reaches_its_receiver_signed_with_its_secret(
    routed: RelayProcess,
    support: WebhookReceiver,
    billing: WebhookReceiver,
    default: WebhookReceiver,
    recipient: str,
    route: str,
    secret: str,
) -> None:
    with routed.smtp() as smtp:
        assert smtp.sendmail("al@other.test", [recipient], message("al@other.test", recipient)) == {}
    assert one_post(support, secret)["recipient"] == recipient
    assert (billing.requests, default.requests) == ([], [])


def test_domain_route_with_aligned_partner_passes_the_policy(routed: RelayProcess, billing: WebhookReceiver) -> None:
    with routed.smtp() as smtp:
        smtp.sendmail("ap@partner.test", ["invoices@billing.test"], message("ap@partner.test", "invoices@billing.test"))
    payload = one_post(billing, "billing-secret")
    assert (payload["recipient"], payload["dmarc_result"]) == ("invoices@billing.test", "pass")


def test_policy_deny_answers_550_5_7_1_with_the_configured_text(routed: RelayProcess, billing: WebhookReceiver) -> None:
    """The billing route takes only DMARC-aligned mail from partner.test: an unauthenticated author is denied."""
    with routed.smtp() as smtp, pytest.raises(smtplib.SMTPDataError) as caught:
        smtp.sendmail("x@stranger.test", ["invoices@billing.test"], message("x@stranger.test", "invoices@billing.test"))
    assert (caught.value.smtp_code, caught.value.smtp_error.decode()) == (550, f"5.7.1 {DENY_TEXT}")
    assert billing.requests == []
    (refusal,) = [e for e in routed.events("message_refused") if e.get("reason") == "sender_policy"][-1:]
    assert refusal["policies"] == ["billing-only-aligned-partner"]


def test_policy_sees_attachment_types(routed: RelayProcess, default: WebhookReceiver) -> None:
    raw = (
        b"From: <al@other.test>\r\nTo: inbox@example.test\r\nSubject: exe\r\nMIME-Version: 1.0\r\n"
        b'Content-Type: multipart/mixed; boundary="b"\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\nhi\r\n'
        b"--b\r\nContent-Type: application/x-msdownload\r\nContent-Disposition: attachment; filename=a.bin\r\n\r\n"
        b"MZ\r\n--b--\r\n"
    )
    with routed.smtp() as smtp, pytest.raises(smtplib.SMTPDataError) as caught:
        smtp.sendmail("al@other.test", ["inbox@example.test"], raw)
    assert caught.value.smtp_code == 550
    assert default.requests == []


def test_recipient_of_another_route_gets_452_and_the_first_route_its_post(
    routed: RelayProcess, support: WebhookReceiver, default: WebhookReceiver
) -> None:
    with routed.smtp() as smtp:
        refused = smtp.sendmail(
            "al@other.test",
            ["support@example.test", "inbox@example.test"],
            message("al@other.test", "support@example.test"),
        )
    assert refused == {
        "inbox@example.test": (452, b"4.5.3 Recipient of another route: send it in a separate transaction")
    }
    assert one_post(support, "support-secret")["recipient"] == "support@example.test"
    assert default.requests == []


def test_unmatched_address_gets_550(routed: RelayProcess) -> None:
    with routed.smtp() as smtp:
        smtp.ehlo()
        smtp.mail("al@other.test")
        assert smtp.rcpt("someone@example.test") == (550, b"No such user here")


def run_relay(tmp_path: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    env = relay_env(
        **{"PORT": str(free_port()), "HEALTH_PORT": str(free_port()), "BIND_ADDRESS": "127.0.0.1", **settings}
    )
    return subprocess.run(relay_command(), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=20)


@pytest.mark.parametrize(
    ("settings", "files", "error"),
    [
        pytest.param(
            {"TARGET_EMAILS": "*@example.test", "WEBHOOK_URL": "http://127.0.0.1:9/a", "ROUTES_FILE": "routes.toml"},
            {
                "routes.toml": '[[route]]\nname = "s"\npatterns = ["sales@example.test"]\nwebhook_url = "http://127.0.0.1:9/s"\n'
            },
            "MAIL_RELAY_ROUTES_FILE: overlapping patterns: '*@example.test' (route 'default') and "
            "'sales@example.test' (route 's') match the same addresses",
            id="overlapping-routes",
        ),
    ],
)
def test_bad_routing_config_stops_start_up_with_one_line(
    tmp_path: Path, settings: dict[str, str], files: dict[str, str], error: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    result = run_relay(tmp_path, **settings)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mailrelay: configuration error: {error}")


def test_queue_mode_delivers_each_message_to_its_route(
    queue_relay: Callable[..., RelayProcess],
    own_webhook: WebhookReceiver,
    nats_server: NatsServer,
    stream_name: str,
    tmp_path: Path,
) -> None:
    """The route travels with the queued message: the workers post it to the route's webhook with its secret."""
    with WebhookReceiver() as sales:
        (tmp_path / "routes.toml").write_text(
            f'[[route]]\nname = "sales"\npatterns = ["*@sales.test"]\nwebhook_url = "{sales.url}"\n'
            'signing_secret = "sales-secret"\n'
        )
        relay = queue_relay(nats_server.url, stream_name, ROUTES_FILE=str(tmp_path / "routes.toml"))
        with relay.smtp() as smtp:
            smtp.sendmail("al@other.test", ["deals@sales.test"], message("al@other.test", "deals@sales.test"))
            smtp.sendmail("al@other.test", ["inbox@example.test"], message("al@other.test", "inbox@example.test"))
        assert one_post(sales, "sales-secret")["recipient"] == "deals@sales.test"
    assert one_post(own_webhook, SECRET)["recipient"] == "inbox@example.test"
