"""Fakes and helpers for tests of the relay, and for users testing their webhook receivers.

`WebhookReceiver` is a real HTTP server on 127.0.0.1 that records requests and answers from a script;
`FakeClock` (moves time by hand) and `free_port()` (an unused TCP port) are bastion_core's, shared with Bastion;
`payload_schema(version)` is the JSON Schema of the payload a receiver gets.
"""

from __future__ import annotations

import http.server
import importlib.resources
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from bastion_core.testing import FakeClock, free_port

__all__ = ["FakeClock", "RecordedRequest", "ScriptedResponse", "WebhookReceiver", "free_port", "payload_schema"]


def payload_schema(version: int = 1) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of webhook payload `version` 1 or 2, as shipped in `mailrelay/schemas/`;
    ValueError for another version. Validate with any JSON Schema library (`jsonschema.validate(payload, ...)`)."""
    if version not in (1, 2):
        raise ValueError(f"payload version {version!r} is not 1 or 2")
    text = importlib.resources.files("mailrelay").joinpath("schemas", f"payload-v{version}.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    received_at: float

    def header(self, name: str) -> str | None:
        """Case-insensitive header lookup."""
        lowered = name.lower()
        for key, value in self.headers.items():
            if key.lower() == lowered:
                return value
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptedResponse:
    """One scripted answer: a status, extra headers, and an optional delay before answering."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    body: bytes = b""


class WebhookReceiver:
    """A real HTTP server in a background thread that records every request.

    `script(...)` queues answers (ints or ScriptedResponse) consumed one per request; when the
    queue is empty it answers `default`. `answer_with(function)` answers every request from what the function
    returns for it instead (e.g. by body); `hold()` records requests as they arrive but keeps every answer back
    until `release()`. Use as a context manager or call start()/stop().
    """

    def __init__(self, host: str = "127.0.0.1", *, default: int = 200) -> None:
        self.host = host
        self.default = ScriptedResponse(status=default)
        self.requests: list[RecordedRequest] = []
        self._script: list[ScriptedResponse] = []
        self._answer: Callable[[RecordedRequest], int | ScriptedResponse] | None = None
        self._released = threading.Event()
        self._released.set()
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/webhook"

    def script(self, *responses: int | ScriptedResponse) -> None:
        with self._lock:
            self._script.extend(r if isinstance(r, ScriptedResponse) else ScriptedResponse(status=r) for r in responses)

    def answer_with(self, function: Callable[[RecordedRequest], int | ScriptedResponse] | None) -> None:
        with self._lock:
            self._answer = function

    def hold(self) -> None:
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def reset(self, *, default: int = 200) -> None:
        with self._lock:
            self.requests.clear()
            self._script.clear()
            self._answer = None
            self.default = ScriptedResponse(status=default)
        self._released.set()

    def wait_for(self, count: int, timeout: float = 10.0) -> list[RecordedRequest]:
        """Block until at least `count` requests arrived (or the timeout passed); return them."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while len(self.requests) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._arrived.wait(remaining)
            return list(self.requests)

    def _next(self, request: RecordedRequest) -> ScriptedResponse:
        with self._arrived:
            self.requests.append(request)
            self._arrived.notify_all()
            if self._answer is not None:
                answer = self._answer(request)
                return answer if isinstance(answer, ScriptedResponse) else ScriptedResponse(status=answer)
            return self._script.pop(0) if self._script else self.default

    def start(self) -> WebhookReceiver:
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                answer = receiver._next(
                    RecordedRequest(
                        method=self.command,
                        path=self.path,
                        headers=dict(self.headers.items()),
                        body=body,
                        received_at=time.time(),
                    )
                )
                receiver._released.wait()
                if answer.delay:
                    time.sleep(answer.delay)
                try:
                    self.send_response(answer.status)
                    for name, value in answer.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(answer.body)))
                    self.end_headers()
                    self.wfile.write(answer.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, format: str, *args: object) -> None:  # silence per-request stderr lines
                return

        self._server = http.server.ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        server = self._server
        self._thread = threading.Thread(  # a short poll interval: stop() returns at once, not after up to 0.5 s
            target=lambda: server.serve_forever(poll_interval=0.05), name="webhook-receiver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._released.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def bodies(self) -> Iterable[bytes]:
        return [r.body for r in self.requests]
