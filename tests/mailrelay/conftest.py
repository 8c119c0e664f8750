"""Fixtures for MailRelay unit and integration tests."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from mailrelay.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_client() -> Callable[[Callable[[httpx.Request], httpx.Response]], httpx.AsyncClient]:
    """Factory: an httpx.AsyncClient whose transport is the given request handler."""

    def make(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(handler))

    return make
