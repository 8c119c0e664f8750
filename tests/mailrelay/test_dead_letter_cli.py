"""`mailrelay dead-letters list|show|replay` against a real NATS JetStream server: letters stay put until replayed,
filters select them, a replay queues the payload again under its original delivery id and removes the letter."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from pathlib import Path

import nats
import nats.js.errors
import pytest

from mailrelay._queue import JetStreamQueue
from mailrelay.cli import main
from mailrelay.testing import free_port
from tests.nats_server import NatsServer

LETTERS = [
    {"id": "a" * 32, "error": "HTTP 422", "attempts": "1", "route": None, "subject": "refused"},
    {"id": "b" * 32, "error": "HTTP 500", "attempts": "25", "route": "billing", "subject": "failing"},
    {"id": "c" * 32, "error": "timeout", "attempts": "25", "route": "support", "subject": "slow"},
]

Run = Callable[..., tuple[int, str, str]]


async def _set_up(url: str, stream: str) -> None:
    queue = JetStreamQueue(servers=[url], stream=stream, ack_wait=30, shown_url=url)
    await queue.open()  # the stream and consumer exactly as a relay makes them
    await queue.close()
    nc = await nats.connect(url)
    js = nc.jetstream()
    for letter in LETTERS:
        headers = {
            "Nats-Msg-Id": f"{letter['id']}.dead",
            "MailRelay-Delivery-Id": str(letter["id"]),
            "MailRelay-Error": str(letter["error"]),
            "MailRelay-Attempts": str(letter["attempts"]),
            "MailRelay-Accepted-At": "1800000000.000",
            **({"MailRelay-Route": str(letter["route"])} if letter["route"] else {}),
        }
        body = json.dumps({"subject": letter["subject"]}).encode()
        await js.publish(f"{stream}.dead", body, stream=stream, headers=headers)
    await nc.close()


async def _read(url: str, stream: str, subject: str) -> list[tuple[int, dict[str, str], bytes]]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    found, sequence = [], 1
    try:
        while True:
            try:
                raw = await js.get_msg(stream, seq=sequence, subject=f"{stream}.{subject}", next=True)
            except nats.js.errors.NotFoundError:
                return found
            found.append((raw.seq or 0, dict(raw.headers or {}), raw.data or b""))
            sequence = (raw.seq or 0) + 1
    finally:
        await nc.close()


@pytest.fixture
def stream(nats_server: NatsServer) -> str:
    name = f"DL{uuid.uuid4().hex[:12]}"
    asyncio.run(_set_up(nats_server.url, name))
    return name


@pytest.fixture
def run(
    nats_server: NatsServer,
    stream: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> Run:
    """run("list", "--route", "x") -> (exit code, stdout, stderr), with the relay's variables naming the server."""
    monkeypatch.chdir(tmp_path)  # no stray .env
    monkeypatch.setenv("MAIL_RELAY_NATS_URL", nats_server.url)
    monkeypatch.setenv("MAIL_RELAY_QUEUE_STREAM", stream)

    def invoke(*argv: str) -> tuple[int, str, str]:
        code = main(["dead-letters", *argv])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return invoke


def test_list_shows_every_letter_oldest_first_and_leaves_them(run: Run, nats_server: NatsServer, stream: str) -> None:
    code, out, err = run("list")
    lines = out.splitlines()
    assert (code, err) == (0, "")
    assert lines[0].split() == ["SEQ", "DELIVERY", "ID", "ROUTE", "AGE", "TRIES", "ERROR"]
    assert [line.split()[1:3] for line in lines[1:4]] == [
        ["a" * 32, "default"],
        ["b" * 32, "billing"],
        ["c" * 32, "support"],
    ]
    assert [line.split(maxsplit=5)[4:] for line in lines[1:4]] == [
        ["1", "HTTP 422"],
        ["25", "HTTP 500"],
        ["25", "timeout"],
    ]
    assert lines[4] == "3 dead letters"
    assert len(asyncio.run(_read(nats_server.url, stream, "dead"))) == 3


@pytest.mark.parametrize(
    ("options", "selected"),
    [
        (["--route", "billing"], ["b" * 32]),
        (["--route", "default"], ["a" * 32]),
        (["--error", "http"], ["a" * 32, "b" * 32]),
        (["--error", "http", "--route", "SUPPORT"], []),
        (["--newer-than", "1h"], ["a" * 32, "b" * 32, "c" * 32]),
        (["--older-than", "1h"], []),
        (["--limit", "2"], ["a" * 32, "b" * 32]),
    ],
    ids=["route", "unnamed-route", "error", "both", "newer", "older", "limit"],
)
def test_list_filters(run: Run, options: list[str], selected: list[str]) -> None:
    code, out, _ = run("list", "--json", *options)
    assert code == 0
    assert [json.loads(line)["delivery_id"] for line in out.splitlines()] == selected


def test_list_json_has_the_record_without_the_payload(run: Run) -> None:
    _, out, _ = run("list", "--json", "--route", "billing")
    record = json.loads(out)
    assert {k: record[k] for k in ("delivery_id", "route", "error", "attempts", "accepted_at")} == {
        "delivery_id": "b" * 32,
        "route": "billing",
        "error": "HTTP 500",
        "attempts": 25,
        "accepted_at": "2027-01-15T08:00:00Z",
    }
    assert "payload" not in record


def test_show_by_delivery_id_and_by_sequence(run: Run) -> None:
    code, out, _ = run("show", "c" * 32)
    shown = json.loads(out)
    assert (code, shown["error"], shown["payload"]) == (0, "timeout", {"subject": "slow"})
    assert json.loads(run("show", str(shown["sequence"]))[1]) == shown


def test_show_unknown_letter_is_one_line_and_exit_1(run: Run, stream: str) -> None:
    assert run("show", "nope") == (1, "", f"mailrelay: error: no dead letter 'nope' in stream {stream}\n")


def test_replay_queues_the_payload_again_with_its_delivery_id(run: Run, nats_server: NatsServer, stream: str) -> None:
    code, out, err = run("replay", "b" * 32)
    assert (code, err) == (0, "")
    assert out.splitlines()[-1] == "1 dead letter replayed"
    (queued,) = asyncio.run(_read(nats_server.url, stream, "messages"))
    _, headers, body = queued
    assert (headers["MailRelay-Delivery-Id"], headers["MailRelay-Route"], body) == (
        "b" * 32,
        "billing",
        b'{"subject": "failing"}',
    )
    assert headers["Nats-Msg-Id"].startswith("b" * 32 + ".replay.")
    left = [h["MailRelay-Delivery-Id"] for _, h, _ in asyncio.run(_read(nats_server.url, stream, "dead"))]
    assert left == ["a" * 32, "c" * 32]


def test_replay_all_with_a_filter(run: Run, nats_server: NatsServer, stream: str) -> None:
    code, out, _ = run("replay", "--all", "--error", "HTTP")
    assert (code, out.splitlines()[-1]) == (0, "2 dead letters replayed")
    queued = [h["MailRelay-Delivery-Id"] for _, h, _ in asyncio.run(_read(nats_server.url, stream, "messages"))]
    assert queued == ["a" * 32, "b" * 32]
    assert "MailRelay-Route" not in asyncio.run(_read(nats_server.url, stream, "messages"))[0][1]


def test_dry_run_changes_nothing(run: Run, nats_server: NatsServer, stream: str) -> None:
    code, out, _ = run("replay", "--all", "--dry-run")
    assert (code, out.splitlines()[-1]) == (0, "3 dead letters would replay")
    assert asyncio.run(_read(nats_server.url, stream, "messages")) == []
    assert len(asyncio.run(_read(nats_server.url, stream, "dead"))) == 3


def test_replay_of_a_missing_letter_replays_none(run: Run, nats_server: NatsServer, stream: str) -> None:
    assert run("replay", "a" * 32, "nope")[0] == 1
    assert asyncio.run(_read(nats_server.url, stream, "messages")) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["replay"], "name dead letters (SEQ or DELIVERY_ID) or give --all, not both"),
        (["replay", "--all", "x"], "name dead letters (SEQ or DELIVERY_ID) or give --all, not both"),
        (
            ["list", "--older-than", "soon"],
            "argument --older-than: expected a duration like 90s, 15m, 2h or 7d, got 'soon'",
        ),
        (["list", "--limit", "0"], "argument --limit: expected a positive integer, got 0"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(run: Run, argv: list[str], message: str) -> None:
    code, out, err = run(*argv)
    assert (code, out) == (2, "")
    assert err == f"mailrelay dead-letters: error: {message} (see mailrelay dead-letters --help)\n"


def test_without_a_nats_url_it_is_a_configuration_error(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MAIL_RELAY_NATS_URL")
    assert run("list") == (
        2,
        "",
        "mailrelay: configuration error: MAIL_RELAY_NATS_URL: expected a NATS URL like nats://127.0.0.1:4222 "
        "(or --nats-url), got <unset>\n",
    )


def test_nats_down_is_one_line_and_exit_1(run: Run) -> None:
    url = f"nats://user:secret@127.0.0.1:{free_port()}"
    code, out, err = run("list", "--nats-url", url)
    assert (code, out) == (1, "")
    assert err == f"mailrelay: error: NATS at {url.replace(':secret', ':***')}: no server reachable\n"
    assert "secret" not in err


def test_an_unknown_stream_is_one_line_and_exit_1(run: Run, nats_server: NatsServer) -> None:
    assert run("list", "--stream", "NOSUCHSTREAM") == (
        1,
        "",
        f"mailrelay: error: NATS at {nats_server.url}: stream NOSUCHSTREAM not found\n",
    )
