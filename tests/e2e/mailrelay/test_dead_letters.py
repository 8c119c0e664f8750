"""Dead letters you can act on, through the real processes: a relay in queue mode dead-letters what the webhook
refuses, /ready counts it, `mailrelay dead-letters` lists and replays it (every option in
tests/mailrelay/test_dead_letter_cli.py), and the replayed POST carries the
original delivery id."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import httpx
import pytest

from mailrelay.cli import main
from mailrelay.testing import WebhookReceiver
from tests.e2e.mailrelay.support import RelayProcess, relay_command, relay_env, send_message, wait_until
from tests.nats_server import NatsServer

ACCEPTED = (250, b"OK: Message accepted for delivery")
DELIVERY_TIMEOUT_SECS = 20.0


def dead_letters(nats_url: str, stream: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """`mailrelay dead-letters ...` as an operator runs it, configured by the relay's own variables."""
    return subprocess.run(
        [*relay_command(), "dead-letters", *argv],
        env=relay_env(NATS_URL=nats_url, QUEUE_STREAM=stream),
        capture_output=True,
        text=True,
        timeout=30,
    )


def ready(relay: RelayProcess) -> tuple[int, object]:
    response = httpx.get(f"http://127.0.0.1:{relay.health_port}/ready", timeout=5)
    return response.status_code, response.json()["dependencies"]


@pytest.mark.slow  # a relay in queue mode and a command process: about 4 s here
def test_a_refused_message_is_listed_and_replayed_with_its_delivery_id(
    queue_relay: Callable[..., RelayProcess],
    own_webhook: WebhookReceiver,
    nats_server: NatsServer,
    stream_name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    own_webhook.reset(default=422)
    relay = queue_relay(nats_server.url, stream_name)
    assert ready(relay) == (200, {"queue": {"healthy": True, "messages": 0, "dead_letters": 0}})
    assert send_message(relay, "refused once") == ACCEPTED
    assert wait_until(lambda: bool(relay.events("message_dead_lettered")), DELIVERY_TIMEOUT_SECS)
    (refused,) = own_webhook.requests
    delivery_id = refused.header("X-MailRelay-Delivery-Id")
    assert ready(relay) == (200, {"queue": {"healthy": True, "messages": 0, "dead_letters": 1}})

    # listed in-process (every option: tests/mailrelay/test_dead_letter_cli.py), replayed by the real command
    argv = ["dead-letters", "list", "--error", "422", "--json", "--nats-url", nats_server.url, "--stream", stream_name]
    assert main(argv) == 0
    listed = capsys.readouterr()
    assert listed.err == ""
    record = json.loads(listed.out)
    assert (record["delivery_id"], record["route"], record["error"], record["attempts"]) == (
        delivery_id,
        "default",
        "HTTP 422",
        1,
    )

    own_webhook.reset()  # the receiver is fixed: 200 from now on
    replayed = dead_letters(nats_server.url, stream_name, "replay", str(record["sequence"]))
    assert (replayed.returncode, replayed.stdout.splitlines()[-1]) == (0, "1 dead letter replayed")
    (posted,) = own_webhook.wait_for(1, DELIVERY_TIMEOUT_SECS)
    assert posted.header("X-MailRelay-Delivery-Id") == delivery_id
    assert posted.body == refused.body
    assert wait_until(lambda: ready(relay)[1] == {"queue": {"healthy": True, "messages": 0, "dead_letters": 0}}, 5)
