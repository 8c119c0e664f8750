"""A JWKS URL (how identity providers publish keys): fetched, cached, refreshed on an unknown ``kid``."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import structlog

from bastion.errors import Unavailable

MIN_REFRESH_INTERVAL_SECS = 10.0
FETCH_TIMEOUT_SECS = 5.0
MAX_DOCUMENT_BYTES = 1_000_000

log = structlog.get_logger("bastion.auth.jwks")


class JwksUrlSource:
    """The JWKS document at ``url``.

    Re-fetched when older than ``refresh_secs``, or for a token whose ``kid`` is unknown, but never more than
    once per ``MIN_REFRESH_INTERVAL_SECS`` (random kids cannot turn the service into a request amplifier).
    Raises Unavailable (503) when no document was ever fetched; a failed refresh keeps the old keys.
    """

    def __init__(
        self,
        url: str,
        *,
        refresh_secs: float,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.refresh_secs = refresh_secs
        self.fetches = 0
        self._client = client
        self._clock = clock
        self._fetched_at: float | None = None

    async def document(self, *, unknown_kid: bool, have_keys: bool) -> bytes | None:
        """A freshly fetched document when one is due, else ``None`` (the caller keeps its keys).

        Raises Unavailable when the caller has no keys at all and none can be fetched now.
        """
        now = self._clock()
        if self._fetched_at is not None:
            age = now - self._fetched_at
            urgent = unknown_kid or not have_keys
            if age < self.refresh_secs and not (urgent and age >= MIN_REFRESH_INTERVAL_SECS):
                if not have_keys:
                    raise Unavailable("Token signing keys are unavailable", retry_after=5)
                return None
        self._fetched_at = now
        self.fetches += 1
        try:
            client = self._client or httpx.AsyncClient(timeout=FETCH_TIMEOUT_SECS)
            try:
                response = await client.get(self.url)
            finally:
                if self._client is None:
                    await client.aclose()
            response.raise_for_status()
            if len(response.content) > MAX_DOCUMENT_BYTES:
                raise ValueError("JWKS document too large")
        except (httpx.HTTPError, ValueError) as exc:
            log.error("jwks_fetch_failed", url=self.url, error=f"{type(exc).__name__}: {exc}")
            if not have_keys:
                raise Unavailable("Token signing keys are unavailable", retry_after=5) from None
            return None
        return response.content
