"""Deprecated versions: RFC 8594 headers on every response, the warn log, and the version metric."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import httpx
import pytest
from fastapi import HTTPException
from structlog.testing import capture_logs

from bastion import ConfigError, Deprecation, Service
from tests.conftest import metric_samples, open_settings

SUNSET = "2027-06-30T00:00:00Z"


def documents_service() -> Service:
    service = Service("docs")
    v1 = service.version(1)
    v2 = service.version(2)
    for version in (v1, v2):

        @version.get("/documents")
        async def documents() -> list[str]:
            return ["a"]

        @version.get("/broken")
        async def broken() -> None:
            raise HTTPException(404, "gone")

    service.deprecate(1, replacement=2, sunset=SUNSET, message="v2 pages the document list.")
    return service


class TestHeaders:
    def test_header_values(self) -> None:
        headers = dict(Deprecation(replacement=2, sunset=SUNSET, message="v2 pages the document list.").headers(1))
        assert headers[b"deprecation"] == b'version="v1"'
        assert headers[b"sunset"] == b"Wed, 30 Jun 2027 00:00:00 GMT"
        assert headers[b"link"] == b'</v2/>; rel="successor-version"'
        assert headers[b"warning"] == (
            b'299 - "API version v1 is deprecated. Please migrate to version v2. v2 pages the document list."'
        )

    def test_sunset_is_omitted_without_a_date(self) -> None:
        headers = dict(Deprecation(replacement=2).headers(1))
        assert b"sunset" not in headers
        assert headers[b"warning"] == b'299 - "API version v1 is deprecated. Please migrate to version v2."'

    def test_sunset_with_offset_is_converted_to_gmt(self) -> None:
        deprecation = Deprecation(replacement=2, sunset="2027-06-30T02:00:00+02:00")
        assert deprecation.sunset_at == datetime(2027, 6, 30, tzinfo=UTC)

    @pytest.mark.parametrize("sunset", ["tomorrow", "2027-13-01T00:00:00Z", "2027-06-30T00:00:00"])
    def test_bad_sunset_is_a_config_error(self, sunset: str) -> None:
        with pytest.raises(ConfigError, match="sunset"):
            Deprecation(replacement=2, sunset=sunset)

    @pytest.mark.parametrize("message", ["line\r\nInjected: 1", "snowman \u2603"])
    def test_message_must_fit_a_header(self, message: str) -> None:
        with pytest.raises(ConfigError, match="deprecation message"):
            Deprecation(replacement=2, message=message)

    def test_quotes_in_message_are_escaped(self) -> None:
        warning = dict(Deprecation(replacement=2, message='say "hi"').headers(1))[b"warning"]
        assert warning.endswith(b'say \\"hi\\""')


class TestMiddleware:
    async def test_deprecated_version_responses_carry_headers(
        self, asgi_client: Callable[..., httpx.AsyncClient]
    ) -> None:
        response = await asgi_client(documents_service()).get("/api/v1/documents")
        assert response.status_code == 200
        assert response.headers["deprecation"] == 'version="v1"'
        assert response.headers["sunset"] == "Wed, 30 Jun 2027 00:00:00 GMT"
        assert response.headers["link"] == '</v2/>; rel="successor-version"'
        assert response.headers["warning"].startswith('299 - "API version v1 is deprecated.')

    @pytest.mark.parametrize("path", ["/api/v1/broken", "/api/v1/unknown", "/api/v1/openapi.json"])
    async def test_errors_and_unmatched_paths_of_the_version_carry_headers(
        self, asgi_client: Callable[..., httpx.AsyncClient], path: str
    ) -> None:
        response = await asgi_client(documents_service()).get(path)
        assert response.headers["deprecation"] == 'version="v1"'

    async def test_current_version_has_no_deprecation_headers(
        self, asgi_client: Callable[..., httpx.AsyncClient]
    ) -> None:
        response = await asgi_client(documents_service()).get("/api/v2/documents")
        assert "deprecation" not in response.headers
        assert "warning" not in response.headers

    async def test_warn_log_on_every_request(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        client = asgi_client(documents_service())
        with capture_logs() as logs:
            await client.get("/api/v1/documents")
            await client.get("/api/v1/documents")
            await client.get("/api/v2/documents")
        events = [entry for entry in logs if entry["event"] == "deprecated_api_version_accessed"]
        assert len(events) == 2
        assert events[0] == {
            "event": "deprecated_api_version_accessed",
            "log_level": "warning",
            "path": "/api/v1/documents",
            "deprecated_version": "v1",
            "replacement_version": "v2",
            "sunset_date": SUNSET,
            "message": "v2 pages the document list.",
        }

    async def test_marking_deprecated_while_serving_applies_to_the_next_request(
        self, asgi_client: Callable[..., httpx.AsyncClient]
    ) -> None:
        service = documents_service()
        client = asgi_client(service)
        assert "deprecation" not in (await client.get("/api/v2/documents")).headers
        service.deprecate(2, replacement=1)
        assert (await client.get("/api/v2/documents")).headers["deprecation"] == 'version="v2"'


class TestMetric:
    async def test_version_counter_attributes(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        client = asgi_client(documents_service())
        for path in ("/api/v1/documents", "/api/v1/documents", "/api/v2/documents", "/health"):
            await client.get(path)
        samples = metric_samples((await client.get("/metrics")).text)
        assert {labels: value for (name, labels), value in samples.items() if name == "api_version_requests_total"} == {
            (("deprecated", "true"), ("replacement_version", "v2"), ("version", "v1")): 2,
            (("deprecated", "false"), ("replacement_version", ""), ("version", "v2")): 1,
        }

    async def test_metrics_disabled_records_nothing(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        settings = open_settings(environ={"SERVICE_METRICS_ENABLED": "false"})
        client = asgi_client(documents_service(), settings)
        await client.get("/api/v1/documents")
        assert (await client.get("/metrics")).status_code == 404
