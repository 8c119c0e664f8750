"""The webhook's HTTP: one pooled keep-alive aiohttp session, every attempt through the shared circuit breaker.

Why aiohttp and not httpx: measured here against the bench's receiver, an httpx POST (httpcore, anyio, h11)
cost ~510 us of CPU and an aiohttp one ~85 us; the webhook was over half of the relay's time per message.
"""

from __future__ import annotations

import ssl
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Mapping

import aiohttp
import certifi

from bastion_core import CircuitOpenError, Guard
from mailrelay._delivery import TIMEOUT_PROBLEM, Attempt

MAX_DRAINED_RESPONSE_BYTES = 64 * 1024  # read small responses so the connection can be reused
MAX_CONNECTIONS = 100
STREAMED_BODY_BYTES = 1024 * 1024  # bigger bodies are written in pieces: one write would copy it all on the loop
BODY_PIECE_BYTES = 256 * 1024  # MAIL_RELAY_MAX_SESSIONS (100) bounds the POSTs of direct mode anyway
_CONNECT_ERRORS = (aiohttp.ClientConnectorError,)


def tls_context() -> ssl.SSLContext:
    """Verify https webhooks against the system's CAs and certifi's bundle (what httpx trusted before)."""
    context = ssl.create_default_context()
    context.load_verify_locations(cafile=certifi.where())
    return context


def env_proxy(url: str) -> str | None:
    """The proxy the standard variables (HTTP_PROXY, HTTPS_PROXY, NO_PROXY) choose for `url`, looked up once:
    aiohttp's own trust_env looks them (and ~/.netrc) up on a worker thread for every request."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.hostname is None or urllib.request.proxy_bypass(parsed.hostname):
        return None
    return urllib.request.getproxies_environment().get(parsed.scheme)


async def _pieces(body: bytes) -> AsyncIterator[memoryview]:
    """The body in slices (no copies), so the socket buffer takes it piece by piece between other sessions' work;
    sent with its Content-Length (not chunked)."""
    view = memoryview(body)
    for start in range(0, len(view), BODY_PIECE_BYTES):
        yield view[start : start + BODY_PIECE_BYTES]


def _problem(exc: aiohttp.ClientError) -> str:
    """A short, stable name for a network failure (no URL, no message text from the peer)."""
    if isinstance(exc, _CONNECT_ERRORS):
        return "connection error: ConnectError"
    return f"connection error: {type(exc).__name__}"


class AiohttpTransport:
    """Implements WebhookTransport: POSTs to `url` over `session`, each attempt inside `guard.call()`.

    The breaker sees every attempt: a 5xx, a timeout or a connection error is a failure, any other status a
    success; an open circuit comes back as ``Attempt(circuit_open=True)`` without a request. `timeout` bounds
    the whole attempt, connect to last byte. The status line is the answer: a body that stalls or is cut short
    afterwards does not turn a 200 into a retry (which would post the message twice). Redirects are not followed.
    """

    def __init__(
        self, *, url: str, guard: Guard, timeout: float, session: aiohttp.ClientSession, proxy: str | None = None
    ) -> None:
        self.url = url
        self.guard = guard
        self.session = session
        self.proxy = proxy
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    @classmethod
    def open(cls, *, url: str, guard: Guard, timeout: float) -> AiohttpTransport:
        """A transport with its own session (to be closed with `close()`); call inside the running loop."""
        connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, ssl=tls_context())
        session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, skip_auto_headers=("Accept-Encoding",)
        )
        return cls(url=url, guard=guard, timeout=timeout, session=session, proxy=env_proxy(url))

    async def post(self, body: bytes, headers: Mapping[str, str]) -> Attempt:
        data: bytes | AsyncIterator[memoryview] = body
        if len(body) > STREAMED_BODY_BYTES:
            data, headers = _pieces(body), {**headers, "Content-Length": str(len(body))}
        try:
            async with self.guard.call() as call:
                response = await self.session.post(
                    self.url,
                    data=data,
                    headers=headers,
                    allow_redirects=False,
                    timeout=self._timeout,
                    proxy=self.proxy,
                )
                if response.status >= 500:
                    call.fail()
        except CircuitOpenError:
            return Attempt(error="circuit open", circuit_open=True)
        except TimeoutError:
            return Attempt(error=TIMEOUT_PROBLEM)
        except aiohttp.ClientError as exc:
            return Attempt(error=_problem(exc))
        answer = Attempt(status=response.status, retry_after=response.headers.get("Retry-After"))
        try:
            length = response.content_length
            if length is not None and length <= MAX_DRAINED_RESPONSE_BYTES:
                await response.read()
        except (TimeoutError, aiohttp.ClientError):
            pass  # read only so the connection can be reused; the answer is already in
        finally:
            response.release()
        return answer

    async def close(self) -> None:
        await self.session.close()
