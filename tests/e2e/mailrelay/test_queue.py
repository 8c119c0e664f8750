"""Queue mode end to end: real `mailrelay` processes, a real `nats-server -js`, a real webhook receiver.

250 means JetStream stored the message; delivery workers (in any relay on the stream) POST it, retry it, or put it
on the dead-letter subject. Every test counts each 250 against the webhooks received, by delivery id.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import signal
import smtplib
import threading
from collections.abc import Callable

from mailrelay.testing import RecordedRequest, ScriptedResponse, WebhookReceiver
from tests.e2e.mailrelay.support import (
    SECRET,
    RelayProcess,
    posts_by_delivery_id,
    read_dead_letters,
    send_message,
    subject_of,
    wait_until,
)
from tests.nats_server import NatsServer

ACCEPTED = (250, b"OK: Message accepted for delivery")
QUEUE_DOWN = (451, b"4.3.0 Queue temporarily unavailable, try again later")
DELIVERY_TIMEOUT_SECS = 20.0

StartQueueRelay = Callable[..., RelayProcess]


def delivered_subjects(webhook: WebhookReceiver) -> set[str]:
    return {subject_of(request) for request in webhook.requests}


def test_250_comes_from_the_stream_then_the_webhook_gets_the_signed_payload(
    queue_relay: StartQueueRelay, own_webhook: WebhookReceiver, nats_server: NatsServer, stream_name: str
) -> None:
    relay = queue_relay(nats_server.url, stream_name)
    assert send_message(relay, "queued") == ACCEPTED
    (request,) = own_webhook.wait_for(1)
    assert subject_of(request) == "queued"
    timestamp = request.header("X-MailRelay-Timestamp") or ""
    digest = hmac.new(SECRET.encode(), f"{timestamp}.".encode() + request.body, hashlib.sha256).hexdigest()
    assert request.header("X-MailRelay-Signature-256") == f"sha256={digest}"
    delivery_id = request.header("X-MailRelay-Delivery-Id")
    assert wait_until(lambda: bool(relay.events("message_relayed")), 5)
    (queued,) = relay.events("message_queued")
    (relayed,) = relay.events("message_relayed")
    assert queued["delivery_id"] == relayed["delivery_id"] == delivery_id
    assert (relayed["outcome"], relayed["status"], relayed["attempt"]) == ("delivered", 200, 1)


def test_250_does_not_wait_for_a_slow_webhook_and_each_message_is_posted_once(
    queue_relay: StartQueueRelay, own_webhook: WebhookReceiver, nats_server: NatsServer, stream_name: str
) -> None:
    """A 2xx that takes a second (under WEBHOOK_TIMEOUT, under QUEUE_ACK_WAIT) is neither retried nor redelivered."""
    own_webhook.answer_with(lambda request: ScriptedResponse(status=200, delay=1.0))
    own_webhook.hold()  # no answer at all until every message has its 250
    relay = queue_relay(nats_server.url, stream_name)
    assert [send_message(relay, f"slow-{n}") for n in range(3)] == [ACCEPTED] * 3
    own_webhook.release()
    assert wait_until(lambda: delivered_subjects(own_webhook) == {"slow-0", "slow-1", "slow-2"}, DELIVERY_TIMEOUT_SECS)
    assert wait_until(lambda: len(relay.events("message_relayed")) == 3, DELIVERY_TIMEOUT_SECS)
    posts = posts_by_delivery_id(own_webhook.requests)
    assert sorted(posts.values()) == [["slow-0"], ["slow-1"], ["slow-2"]]


def test_webhook_down_for_a_while_then_back_gets_every_accepted_message(
    queue_relay: StartQueueRelay, own_webhook: WebhookReceiver, nats_server: NatsServer, stream_name: str
) -> None:
    up = threading.Event()
    own_webhook.answer_with(lambda request: 200 if up.is_set() else 503)
    relay = queue_relay(nats_server.url, stream_name, CIRCUIT_BREAKER_RESET="0.5", CIRCUIT_BREAKER_MIN_REQUESTS="4")
    sent = {f"down-{n}" for n in range(5)}
    assert [send_message(relay, subject) for subject in sorted(sent)] == [ACCEPTED] * 5
    assert wait_until(lambda: len(own_webhook.requests) >= 8, DELIVERY_TIMEOUT_SECS)  # refused, and retried
    assert relay.events("webhook_retry_scheduled")
    up.set()
    assert wait_until(lambda: len(relay.events("message_relayed")) == 5, DELIVERY_TIMEOUT_SECS)
    assert {event["outcome"] for event in relay.events("message_relayed")} == {"delivered"}
    assert delivered_subjects(own_webhook) == sent
    assert relay.events("message_dead_lettered") == []


def _poison(request: RecordedRequest) -> int:
    return {"poison-422": 422, "poison-500": 500}.get(subject_of(request), 200)


def test_poison_messages_go_to_the_dead_letter_subject_and_the_rest_flows(
    queue_relay: StartQueueRelay, own_webhook: WebhookReceiver, nats_server: NatsServer, stream_name: str
) -> None:
    own_webhook.answer_with(_poison)
    relay = queue_relay(nats_server.url, stream_name, QUEUE_MAX_ATTEMPTS="3", CIRCUIT_BREAKER_FAILURE_RATE="1.0")
    subjects = ["ok-0", "poison-500", "ok-1", "poison-422", "ok-2"]
    assert [send_message(relay, subject) for subject in subjects] == [ACCEPTED] * 5
    letters = read_dead_letters(nats_server.url, stream_name, 2)
    assert len(letters) == 2
    assert wait_until(
        lambda: len(relay.events("message_dead_lettered")) == 2 and len(relay.events("message_relayed")) == 3,
        DELIVERY_TIMEOUT_SECS,
    )
    posts = posts_by_delivery_id(own_webhook.requests)
    dead = {posts[(h := letter.headers or {})["MailRelay-Delivery-Id"]][0]: h for letter in letters}
    assert (dead["poison-422"]["MailRelay-Error"], dead["poison-422"]["MailRelay-Attempts"]) == ("HTTP 422", "1")
    assert (dead["poison-500"]["MailRelay-Error"], dead["poison-500"]["MailRelay-Attempts"]) == ("HTTP 500", "3")
    assert sorted(subjects for subjects in posts.values()) == [
        ["ok-0"],
        ["ok-1"],
        ["ok-2"],
        ["poison-422"],
        ["poison-500"] * 3,
    ]


def test_two_relays_share_one_stream_and_post_each_message_once(
    queue_relay: StartQueueRelay, own_webhook: WebhookReceiver, nats_server: NatsServer, stream_name: str
) -> None:
    """Ten messages to the first relay only: with two deliveries in flight per relay, four POSTs held at once prove
    the second relay delivers what the first accepted."""
    first = queue_relay(nats_server.url, stream_name, QUEUE_WORKERS="2")
    second = queue_relay(nats_server.url, stream_name, QUEUE_WORKERS="2")
    own_webhook.hold()
    sent = [f"shared-{n}" for n in range(10)]
    assert [send_message(first, subject) for subject in sent] == [ACCEPTED] * 10
    assert own_webhook.wait_for(4, DELIVERY_TIMEOUT_SECS)
    assert wait_until(lambda: len(own_webhook.requests) == 4, 0.5)  # and no more while held
    own_webhook.release()
    assert send_message(second, "shared-10") == ACCEPTED
    assert wait_until(lambda: len(delivered_subjects(own_webhook)) == 11, DELIVERY_TIMEOUT_SECS)
    posts = posts_by_delivery_id(own_webhook.requests)
    assert sorted(itertools.chain.from_iterable(posts.values())) == sorted([*sent, "shared-10"])
    assert all(len(subjects) == 1 for subjects in posts.values())
    assert wait_until(lambda: bool(first.events("message_relayed") and second.events("message_relayed")), 5)


class Burst:
    """Senders on several threads, each sending message after message until told to stop or the relay is gone;
    records the reply of every transaction that got one."""

    def __init__(self, relay: RelayProcess, *, prefix: str, senders: int = 3) -> None:
        self.relay = relay
        self.prefix = prefix
        self.replies: dict[str, tuple[int, bytes]] = {}
        self.stop = threading.Event()
        self._numbers = itertools.count()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._send, daemon=True) for _ in range(senders)]

    def _send(self) -> None:
        while not self.stop.is_set():
            with self._lock:
                subject = f"{self.prefix}-{next(self._numbers)}"
            try:
                reply = send_message(self.relay, subject)
            except (OSError, smtplib.SMTPException):
                continue  # no reply: the relay was killed or is refusing; this message never got a 250
            with self._lock:
                self.replies[subject] = reply

    def accepted(self) -> set[str]:
        with self._lock:
            return {subject for subject, reply in self.replies.items() if reply == ACCEPTED}

    def __enter__(self) -> Burst:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


def test_relay_killed_mid_burst_loses_no_accepted_message(
    queue_relay: StartQueueRelay, own_webhook: WebhookReceiver, nats_server: NatsServer, stream_name: str
) -> None:
    own_webhook.hold()  # deliveries pile up in the stream (and one in the relay) while the burst runs
    relay = queue_relay(nats_server.url, stream_name, QUEUE_WORKERS="1", WEBHOOK_TIMEOUT="2", QUEUE_ACK_WAIT="3")
    with Burst(relay, prefix="burst") as burst:
        assert wait_until(lambda: len(burst.accepted()) >= 15, DELIVERY_TIMEOUT_SECS)
        relay.stop(signal.SIGKILL)
    accepted = burst.accepted()
    own_webhook.release()
    restarted = queue_relay(nats_server.url, stream_name)
    assert wait_until(lambda: accepted <= delivered_subjects(own_webhook), DELIVERY_TIMEOUT_SECS)
    # the one delivery the killed relay had under way comes again after QUEUE_ACK_WAIT, with the same delivery id
    assert wait_until(
        lambda: any(len(s) == 2 for s in posts_by_delivery_id(own_webhook.requests).values()), DELIVERY_TIMEOUT_SECS
    )
    posts = posts_by_delivery_id(own_webhook.requests)
    assert all(len(set(subjects)) == 1 for subjects in posts.values())  # one message per delivery id
    assert len(posts) >= len(accepted)
    assert wait_until(lambda: bool(restarted.events("message_relayed")), 5)


def test_nats_restarted_under_load_gives_451_while_down_and_loses_no_250(
    queue_relay: StartQueueRelay, own_webhook: WebhookReceiver, own_nats_server: NatsServer, stream_name: str
) -> None:
    relay = queue_relay(own_nats_server.url, stream_name)
    with Burst(relay, prefix="load") as burst:
        assert wait_until(lambda: len(burst.accepted()) >= 10, DELIVERY_TIMEOUT_SECS)
        own_nats_server.kill()
        assert send_message(relay, "while-down") == QUEUE_DOWN
        own_nats_server.start()
        before = len(burst.accepted())
        assert wait_until(lambda: len(burst.accepted()) >= before + 10, DELIVERY_TIMEOUT_SECS)
    accepted = burst.accepted()
    assert {reply for reply in burst.replies.values()} <= {ACCEPTED, QUEUE_DOWN}
    assert wait_until(lambda: accepted <= delivered_subjects(own_webhook), DELIVERY_TIMEOUT_SECS)
    assert "while-down" not in delivered_subjects(own_webhook)
    posts = posts_by_delivery_id(own_webhook.requests)
    assert all(len(set(subjects)) == 1 for subjects in posts.values())
    assert wait_until(lambda: bool(relay.events("queue_disconnected") and relay.events("queue_reconnected")), 5)
