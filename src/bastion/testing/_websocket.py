"""WebSocket sessions for the test clients: a handshake through the whole app, in-process, as Starlette's.

``client.websocket_connect(url)`` builds the handshake's scope from the client (base URL, default headers,
cookies, an ``as_user`` token) and runs the app on it in the client's event loop: token auth, rate limit and
policy see the upgrade exactly as they see it under ``bastion run``. The session's methods are Starlette's
``WebSocketTestSession``'s (``send_text`` / ``receive_json`` / ``close`` ...); the async client's are awaited.
A handshake the app refuses raises :class:`WebSocketDenialResponse` (the app's HTTP answer: a 401 or 403 in
the error shape), one it closes raises ``WebSocketDisconnect``. ``starlette.testclient`` is not imported: it
warns when httpx rather than httpx2 is installed.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable, Coroutine, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Self
from urllib.parse import unquote

import httpx
from starlette.websockets import WebSocketDisconnect

from bastion.types import ASGIApp, Message, Scope

CLIENT_ADDRESS = ("127.0.0.1", 123)
"""The handshake's peer: the address ``httpx.ASGITransport`` gives HTTP requests, so rate limits key alike."""
_ABNORMAL_CLOSURE = 1006  # RFC 6455 7.4.1: the connection ended without a close frame


class WebSocketDenialResponse(httpx.Response, WebSocketDisconnect):  # type: ignore[misc]
    """The app answered the handshake with an HTTP response instead of accepting it (as Starlette's class of the
    same name): ``status_code``, ``headers`` and ``json()`` are that response's. A ``WebSocketDisconnect``."""


def handshake_scope(request: httpx.Request, *, subprotocols: Sequence[str], state: Mapping[str, Any]) -> Scope:
    """The ASGI scope of a WebSocket handshake for ``request`` (a GET the client built: URL, headers, cookies)."""
    url = request.url
    headers = [(name.lower(), value) for name, value in request.headers.raw if name.lower() != b"connection"]
    headers += [
        (b"connection", b"upgrade"),
        (b"upgrade", b"websocket"),
        (b"sec-websocket-version", b"13"),
        (b"sec-websocket-key", secrets.token_urlsafe(16).encode()),
    ]
    if subprotocols:
        headers.append((b"sec-websocket-protocol", ", ".join(subprotocols).encode()))
    port = url.port or (443 if url.scheme == "https" else 80)
    return {
        "type": "websocket",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "scheme": "wss" if url.scheme in ("https", "wss") else "ws",
        "server": (url.host, port),
        "client": CLIENT_ADDRESS,
        "root_path": "",
        "path": unquote(url.path),
        "raw_path": url.raw_path.split(b"?", 1)[0],
        "query_string": url.query,
        "headers": headers,
        "subprotocols": list(subprotocols),
        "extensions": {"websocket.http.response": {}},
        "state": dict(state),
    }


class AsyncWebSocketSession:
    """One WebSocket connection to the app, in the running event loop: ``async with`` opens it (the handshake)
    and closes it (code 1000, then the app's task is cancelled; an exception it raised is raised here)."""

    def __init__(self, app: ASGIApp, scope: Scope) -> None:
        self.app = app
        self.scope = scope
        self.accepted_subprotocol: str | None = None
        self.extra_headers: list[tuple[bytes, bytes]] | None = None
        self._to_app: asyncio.Queue[Message] = asyncio.Queue()
        self._from_app: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._run(), name="websocket")
        try:
            await self.send({"type": "websocket.connect"})
            message = await self.receive()
            await self._raise_on_close(message)
        except BaseException:
            await self._stop()
            raise
        self.accepted_subprotocol = message.get("subprotocol")
        self.extra_headers = message.get("headers")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        if self._task is not None and not self._task.done():
            await self.close(1000)
        await self._stop()

    async def _run(self) -> None:
        await self.app(self.scope, self._to_app.get, self._from_app.put)

    async def _stop(self) -> None:
        """Cancel the app's task (Starlette's test session does the same) and raise what it raised."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.wait({task})
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]

    async def send(self, message: Message) -> None:
        await self._to_app.put(message)

    async def send_text(self, data: str) -> None:
        await self.send({"type": "websocket.receive", "text": data})

    async def send_bytes(self, data: bytes) -> None:
        await self.send({"type": "websocket.receive", "bytes": data})

    async def send_json(self, data: Any, mode: Literal["text", "binary"] = "text") -> None:
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
        if mode == "text":
            await self.send_text(text)
        else:
            await self.send_bytes(text.encode())

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        await self.send({"type": "websocket.disconnect", "code": code, "reason": reason})

    async def receive(self) -> Message:
        """The app's next message; what the app raised, if it ended with an exception instead."""
        if self._from_app.empty() and self._task is not None and not self._task.done():
            getting = asyncio.ensure_future(self._from_app.get())
            await asyncio.wait({getting, self._task}, return_when=asyncio.FIRST_COMPLETED)
            if getting.done():
                return getting.result()
            getting.cancel()
        if not self._from_app.empty():
            return self._from_app.get_nowait()
        task = self._task
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
        raise WebSocketDisconnect(_ABNORMAL_CLOSURE, "the application ended without closing the WebSocket")

    async def receive_text(self) -> str:
        message = await self.receive()
        await self._raise_on_close(message)
        text: str = message["text"]
        return text

    async def receive_bytes(self) -> bytes:
        message = await self.receive()
        await self._raise_on_close(message)
        data: bytes = message["bytes"]
        return data

    async def receive_json(self, mode: Literal["text", "binary"] = "text") -> Any:
        message = await self.receive()
        await self._raise_on_close(message)
        return json.loads(message["text"] if mode == "text" else message["bytes"].decode())

    async def _raise_on_close(self, message: Message) -> None:
        if message["type"] == "websocket.close":
            raise WebSocketDisconnect(code=message.get("code", 1000), reason=message.get("reason", ""))
        if message["type"] == "websocket.http.response.start":
            body = []
            while True:
                part = await self.receive()
                body.append(part.get("body", b""))
                if not part.get("more_body", False):
                    break
            raise WebSocketDenialResponse(
                status_code=message["status"], headers=message.get("headers", []), content=b"".join(body)
            )


class WebSocketSession:
    """The sync face of :class:`AsyncWebSocketSession` for :class:`~bastion.testing.ServiceClient`: each call runs
    in the client's event loop (``call``: its blocking portal's ``call``)."""

    def __init__(self, session: AsyncWebSocketSession, call: Callable[..., Any]) -> None:
        self._session = session
        self._call = call

    def _run(self, function: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Any:
        return self._call(function, *args)

    @property
    def accepted_subprotocol(self) -> str | None:
        return self._session.accepted_subprotocol

    @property
    def extra_headers(self) -> list[tuple[bytes, bytes]] | None:
        return self._session.extra_headers

    def __enter__(self) -> Self:
        self._run(self._session.__aenter__)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        self._run(self._session.__aexit__)

    def send(self, message: Message) -> None:
        self._run(self._session.send, message)

    def send_text(self, data: str) -> None:
        self._run(self._session.send_text, data)

    def send_bytes(self, data: bytes) -> None:
        self._run(self._session.send_bytes, data)

    def send_json(self, data: Any, mode: Literal["text", "binary"] = "text") -> None:
        self._run(self._session.send_json, data, mode)

    def close(self, code: int = 1000, reason: str | None = None) -> None:
        self._run(self._session.close, code, reason)

    def receive(self) -> Message:
        message: Message = self._run(self._session.receive)
        return message

    def receive_text(self) -> str:
        text: str = self._run(self._session.receive_text)
        return text

    def receive_bytes(self) -> bytes:
        data: bytes = self._run(self._session.receive_bytes)
        return data

    def receive_json(self, mode: Literal["text", "binary"] = "text") -> Any:
        return self._run(self._session.receive_json, mode)
