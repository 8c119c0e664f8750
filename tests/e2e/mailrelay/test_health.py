"""The health endpoint of the real process: /health 200 empty for any method, 404 `Not Found` elsewhere."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.mailrelay.support import RelayProcess


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"])
def test_health_is_200_with_empty_body_for_any_method(relay: RelayProcess, method: str) -> None:
    response = httpx.request(method, f"http://127.0.0.1:{relay.health_port}/health", timeout=5)
    assert response.status_code == 200
    assert response.content == b""


@pytest.mark.parametrize("path", ["/", "/healthz", "/health/extra", "/nope"])
def test_other_paths_are_404_not_found(relay: RelayProcess, path: str) -> None:
    response = httpx.get(f"http://127.0.0.1:{relay.health_port}{path}", timeout=5)
    assert response.status_code == 404
    assert response.text == "Not Found"
