"""Helpers for MailRelay end-to-end tests: the relay process handle, a raw SMTP client, constants."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import smtplib
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import nats.errors
from nats.aio.msg import Msg

from mailrelay.testing import RecordedRequest
from tests.mailrelay.servers import S3_ACCESS_KEY, S3_SECRET_KEY

MAILRELAY = Path(sys.executable).with_name("mailrelay")
STARTUP_TIMEOUT_SECS = 15.0
STOP_TIMEOUT_SECS = 10.0
SMTP_TIMEOUT_SECS = 15.0
SECRET = "e2e-signing-secret"
TARGET = "inbox@example.test"
SECOND_TARGET = "support@example.test"
MAX_MESSAGE_SIZE = 200_000
MAX_ATTACHMENT_SIZE = 20_000
AWS_ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY,
    "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY,
    "AWS_CONFIG_FILE": "/dev/null",  # nothing of the machine's own AWS set-up
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    "AWS_EC2_METADATA_DISABLED": "true",
}
"""The standard AWS variables a relay with S3 delivery gets: the test server's keys."""


@dataclass
class RelayProcess:
    proc: subprocess.Popen[bytes]
    smtp_port: int
    health_port: int
    log_path: Path

    def smtp(self) -> smtplib.SMTP:
        return smtplib.SMTP("127.0.0.1", self.smtp_port, local_hostname="tester.example", timeout=SMTP_TIMEOUT_SECS)

    def raw(self) -> RawSmtp:
        return RawSmtp(socket.create_connection(("127.0.0.1", self.smtp_port), timeout=SMTP_TIMEOUT_SECS))

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The log's events (named `name`, or all). stderr is not a terminal here, so every line must be one
        JSON object; a last line still being written is left out."""
        return log_events(self.logs(), name)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_SECS)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STOP_TIMEOUT_SECS)
        return self.proc.returncode


class RawSmtp:
    """A line-oriented SMTP client over a plain socket, for exact bytes and misbehaving clients."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.file = sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def line(self) -> bytes:
        return self.file.readline().rstrip(b"\r\n")

    def reply(self) -> list[bytes]:
        """All lines of one (possibly multi-line) reply."""
        lines = [self.line()]
        while len(lines[-1]) > 3 and lines[-1][3:4] == b"-":
            lines.append(self.line())
        return lines

    def command(self, text: str) -> list[bytes]:
        self.send(text.encode() + b"\r\n")
        return self.reply()

    def closed_by_server(self) -> bool:
        """True once the server has closed its side (reads return EOF)."""
        return self.file.read(1) == b""

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.file.close()
            self.sock.close()

    def __enter__(self) -> RawSmtp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_until_listening(relay: RelayProcess) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECS
    while time.monotonic() < deadline:
        if relay.proc.poll() is not None:
            raise RuntimeError(f"mailrelay exited with {relay.proc.returncode}:\n{relay.logs()}")
        try:
            with socket.create_connection(("127.0.0.1", relay.smtp_port), timeout=1) as sock:
                sock.settimeout(5)
                if sock.makefile("rb").readline().startswith(b"220"):
                    sock.sendall(b"QUIT\r\n")
                    return
        except OSError:
            time.sleep(0.05)
    relay.stop()
    raise RuntimeError(f"mailrelay did not listen within {STARTUP_TIMEOUT_SECS}s:\n{relay.logs()}")


def log_events(text: str, name: str | None = None) -> list[dict[str, Any]]:
    """JSON log lines as dicts (the events named `name`, or all); a last line without its newline is left out."""
    lines = text.split("\n")[:-1]  # the piece after the last newline is empty or unfinished
    events = [json.loads(line) for line in lines]
    return [event for event in events if name is None or event["event"] == name]


def relay_command() -> list[str]:
    return [str(MAILRELAY)]


def relay_env(**overrides: str) -> dict[str, str]:
    """The process environment without any inherited MAIL_RELAY_* variable, plus `overrides`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAIL_RELAY_")}
    env.update({f"MAIL_RELAY_{k}": v for k, v in overrides.items()})
    return env


def send_message(relay: RelayProcess, subject: str) -> tuple[int, bytes]:
    """One transaction on a fresh connection; the reply to the final dot."""
    with relay.smtp() as smtp:
        smtp.ehlo()
        smtp.mail("alice@example.org")
        smtp.rcpt(TARGET)
        return smtp.data(f"From: alice@example.org\r\nSubject: {subject}\r\n\r\nbody of {subject}\r\n".encode())


def wait_until(condition: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll `condition` until it holds or `timeout` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def subject_of(request: RecordedRequest) -> str:
    return str(json.loads(request.body)["subject"])


def posts_by_delivery_id(requests: list[RecordedRequest]) -> dict[str, list[str]]:
    """Delivery id -> the subjects of the POSTs that carried it (one entry per POST)."""
    posts: dict[str, list[str]] = {}
    for request in requests:
        posts.setdefault(request.header("X-MailRelay-Delivery-Id") or "", []).append(subject_of(request))
    return posts


def read_dead_letters(url: str, stream: str, count: int, timeout: float = 10.0) -> list[Msg]:
    """The first `count` dead letters of `stream`, read by a JetStream consumer of the test's own."""

    async def read() -> list[Msg]:
        nc = await nats.connect(url)
        try:
            sub = await nc.jetstream().pull_subscribe(f"{stream}.dead", stream=stream)
            letters: list[Msg] = []
            deadline = time.monotonic() + timeout
            while len(letters) < count and time.monotonic() < deadline:
                with contextlib.suppress(nats.errors.TimeoutError):
                    letters += await sub.fetch(count - len(letters), timeout=1)
            for letter in letters:
                await letter.ack()
            return letters
        finally:
            await nc.close()

    return asyncio.run(read())
