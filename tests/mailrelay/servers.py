"""Real servers for MailRelay's DMARC and S3 tests: a DNS server (dnslib) and an S3 API server (moto) on loopback.

`DnsZone` answers UDP and TCP on one free port from records the test sets; names can be made to time out or
SERVFAIL. `S3Server` is moto's server mode in a child process (stopped by its PID), see `s3_server.py`.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from dnslib import QTYPE, RCODE, RR, TXT, A, DNSRecord
from dnslib.server import DNSServer

from mailrelay.testing import free_port

HANG_SECS = 10.0  # how long a "slow" name keeps the client waiting (the relay's DNS timeout is far shorter)
STARTUP_TIMEOUT_SECS = 30.0
STOP_TIMEOUT_SECS = 10.0
S3_SERVER_SCRIPT = Path(__file__).with_name("s3_server.py")
S3_ACCESS_KEY = "AKIATESTTESTTESTTEST"
S3_SECRET_KEY = "test-secret-key-for-moto-only"
S3_REGION = "us-east-1"


class _Quiet:
    """A dnslib logger that logs nothing."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class DnsZone:
    """A DNS server on 127.0.0.1:`port` (UDP and TCP) answering from `records`; use as a context manager.

    Names are matched case-insensitively without the final dot. A name in `slow` is answered only after HANG_SECS
    (a timeout for any client); a name in `servfail` gets SERVFAIL; any other unknown name NXDOMAIN.
    """

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], list[Any]] = {}
        self.slow: set[str] = set()
        self.servfail: set[str] = set()
        self.queries: list[tuple[str, str]] = []
        self._stopping = threading.Event()
        self._servers: list[DNSServer] = []
        self.port = 0

    def txt(self, name: str, *texts: str) -> None:
        """Publish TXT records (each split into 255-byte strings as DNS requires)."""
        self.records[(_key(name), "TXT")] = [
            TXT([text[i : i + 255].encode() for i in range(0, max(len(text), 1), 255)]) for text in texts
        ]

    def a(self, name: str, *addresses: str) -> None:
        self.records[(_key(name), "A")] = [A(address) for address in addresses]

    def resolve(self, request: DNSRecord, handler: object) -> DNSRecord:
        reply = request.reply()
        name, qtype = _key(str(request.q.qname)), QTYPE[request.q.qtype]
        self.queries.append((name, qtype))
        if name in self.slow:
            self._stopping.wait(HANG_SECS)
            return reply
        if name in self.servfail:
            reply.header.rcode = RCODE.SERVFAIL
            return reply
        answers = self.records.get((name, qtype))
        if answers is None:
            if not any(key[0] == name for key in self.records):
                reply.header.rcode = RCODE.NXDOMAIN
            return reply
        for rdata in answers:
            reply.add_answer(RR(request.q.qname, request.q.qtype, rdata=rdata, ttl=0))
        return reply

    def start(self) -> DnsZone:
        for _ in range(20):  # a free TCP port is nearly always a free UDP port too
            port = free_port()
            try:
                servers = [
                    DNSServer(self, address="127.0.0.1", port=port, tcp=tcp, logger=_Quiet()) for tcp in (False, True)
                ]
            except OSError:
                continue
            self.port, self._servers = port, servers
            break
        else:
            raise RuntimeError("no free port for the DNS server")
        for server in self._servers:
            server.server.daemon_threads = True
            server.start_thread()
        return self

    def stop(self) -> None:
        self._stopping.set()
        for server in self._servers:
            server.stop()
            server.server.server_close()
        self._servers = []

    def __enter__(self) -> DnsZone:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _key(name: str) -> str:
    return name.lower().rstrip(".")


def rsa_key_pair(bits: int = 2048) -> tuple[bytes, str]:
    """A new RSA key: the PEM private key for dkimpy and the DKIM key record (`v=DKIM1; k=rsa; p=...`)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, "v=DKIM1; k=rsa; p=" + base64.b64encode(public).decode()


class S3Server:
    """moto's S3 API in a child process on 127.0.0.1:`port`; `stop()` ends it by its PID."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> S3Server:
        env = {**os.environ, "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY}
        self.proc = subprocess.Popen(
            [sys.executable, str(S3_SERVER_SCRIPT), "--port", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the S3 server exited with {self.proc.returncode}")
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
            try:
                connection.request("GET", "/")
                if connection.getresponse().status == 200:
                    return self
            except (OSError, http.client.HTTPException):
                pass  # not listening yet, or too slow to answer under load: try again
            finally:
                connection.close()  # also after a timed-out probe (an unclosed socket fails the test run)
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the S3 server did not listen within {STARTUP_TIMEOUT_SECS}s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_SECS)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=STOP_TIMEOUT_SECS)

    def client(self) -> Any:
        """A boto3 client for the test's own checks (create buckets, read objects)."""
        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name=S3_REGION,
            aws_access_key_id=S3_ACCESS_KEY,
            aws_secret_access_key=S3_SECRET_KEY,
        )


@contextlib.contextmanager
def silent_tcp_server() -> Iterator[int]:
    """A port that accepts connections and never answers (a hung server); yields the port."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        for connection in accepted:
            connection.close()
        listener.close()
