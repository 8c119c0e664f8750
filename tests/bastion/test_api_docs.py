"""Swagger UI, ReDoc and the OpenAPI documents per version: public by default, protected with one key."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from bastion import ConfigError, Service, load_settings
from bastion._api_docs import ASSETS_DIR, DOCS_CSP, accepts_gzip, load_assets
from bastion._security import Security
from bastion.testing import TokenMinter
from tests.conftest import open_settings

DOCS_PATHS = ["/api/v1/docs", "/api/v1/redoc", "/api/v1/openapi.json"]
DENY_ALL = "forbid(principal, action, resource);"
PERMIT_ALL = "permit(principal, action, resource);"


def notes_service(*paths: str) -> Service:
    """v1 with ``GET /notes`` and a route on each of ``paths``."""
    service = Service("notes <&>")
    v1 = service.version(1)
    for path in ("/notes", *paths):
        v1.get(path)(lambda: ["n"])
    return service


@pytest.fixture(scope="module")
def minter() -> TokenMinter:
    return TokenMinter("RS256")


@pytest.fixture
def secured(tmp_path: Path, minter: TokenMinter) -> Callable[..., Any]:
    """Settings with token auth and the given policy (and any SERVICE_* overrides)."""
    key = tmp_path / "public.pem"
    key.write_bytes(minter.public_pem())

    def make(policy: str, **environ: str) -> Any:
        policies = tmp_path / "p.cedar"
        policies.write_text(policy)
        return load_settings(
            environ={"SERVICE_TOKEN_PUBLIC_KEY_PATH": str(key), "SERVICE_POLICY_POLICY_PATH": str(policies), **environ}
        )

    return make


class TestPublicByDefault:
    @pytest.mark.parametrize("path", DOCS_PATHS)
    async def test_no_token_and_no_permit_needed(
        self, asgi_client: Callable[..., httpx.AsyncClient], secured: Callable[..., Any], path: str
    ) -> None:
        client = asgi_client(notes_service(), secured(DENY_ALL))
        assert (await client.get(path)).status_code == 200
        assert (await client.get("/api/v1/notes")).status_code == 401  # the business route is still guarded

    async def test_page_escapes_the_service_name_and_forbids_other_origins(
        self, asgi_client: Callable[..., httpx.AsyncClient]
    ) -> None:
        page = await asgi_client(notes_service()).get("/api/v1/docs")
        assert "<title>notes &lt;&amp;&gt; v1 - Swagger UI</title>" in page.text
        assert page.headers["content-security-policy"] == DOCS_CSP
        assert page.headers["x-frame-options"] == "DENY"  # the security headers are still added

    async def test_head_answers_without_a_body(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        client = asgi_client(notes_service())
        page = await client.get("/api/v1/redoc")
        head = await client.head("/api/v1/redoc")
        assert (head.status_code, head.content) == (200, b"")
        assert head.headers["content-length"] == page.headers["content-length"]

    async def test_other_methods_are_refused(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        response = await asgi_client(notes_service()).post("/api/v1/docs")
        assert response.status_code == 405
        assert response.headers["allow"] == "GET, HEAD"

    @pytest.mark.parametrize("logical", sorted(load_assets()))
    async def test_every_asset_is_served_with_its_type_and_a_year_of_caching(
        self, asgi_client: Callable[..., httpx.AsyncClient], logical: str
    ) -> None:
        asset = load_assets()[logical]
        response = await asgi_client(notes_service()).get(
            f"/api/v1/docs/assets/{asset.name}", headers={"accept-encoding": "identity"}
        )
        assert response.status_code == 200
        assert response.headers["content-type"] == asset.content_type.decode()
        assert response.headers["cache-control"] == "public, max-age=31536000, immutable"
        assert response.content == asset.body

    async def test_gzip_is_made_once_and_sent_to_clients_that_accept_it(
        self, asgi_client: Callable[..., httpx.AsyncClient]
    ) -> None:
        asset = load_assets()["redoc.standalone.js"]
        client = asgi_client(notes_service())
        path = f"/api/v1/docs/assets/{asset.name}"
        response = await client.get(path, headers={"accept-encoding": "br, gzip"})
        assert response.headers["content-encoding"] == "gzip"
        assert response.headers["vary"] == "accept-encoding"
        assert response.content == asset.body
        assert gzip.decompress(asset.gzipped()) == asset.body
        plain = await client.get(path, headers={"accept-encoding": "identity"})
        assert "content-encoding" not in plain.headers

    def test_asset_names_carry_a_hash_of_their_content(self) -> None:
        names = {asset.name for asset in load_assets().values()}
        assert all(len(name.split(".")[-2]) == 12 for name in names), names
        assert (ASSETS_DIR / "redoc" / "LICENSE").is_file() and (ASSETS_DIR / "swagger-ui" / "LICENSE").is_file()

    async def test_an_unknown_asset_is_the_empty_404(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        response = await asgi_client(notes_service()).get("/api/v1/docs/assets/swagger-ui-bundle.js")
        assert (response.status_code, response.content) == (404, b"")


class TestProtected:
    @pytest.mark.parametrize("path", DOCS_PATHS)
    async def test_without_a_token_401(
        self, asgi_client: Callable[..., httpx.AsyncClient], secured: Callable[..., Any], path: str
    ) -> None:
        client = asgi_client(notes_service(), secured(PERMIT_ALL, SERVICE_API_DOCS_PUBLIC="false"))
        response = await client.get(path)
        assert response.status_code == 401
        assert response.json() == {"error": "Missing bearer token", "code": "UNAUTHORIZED", "status": 401}

    async def test_with_a_token_the_policy_decides(
        self, asgi_client: Callable[..., httpx.AsyncClient], secured: Callable[..., Any], minter: TokenMinter
    ) -> None:
        token = {"authorization": "Bearer " + minter.mint(sub="alice")}
        denied = asgi_client(notes_service(), secured(DENY_ALL, SERVICE_API_DOCS_PUBLIC="false"))
        permitted = asgi_client(notes_service(), secured(PERMIT_ALL, SERVICE_API_DOCS_PUBLIC="false"))
        assert (await denied.get("/api/v1/docs", headers=token)).status_code == 403
        assert (await permitted.get("/api/v1/docs", headers=token)).status_code == 200

    async def test_assets_are_cached_privately(
        self, asgi_client: Callable[..., httpx.AsyncClient], secured: Callable[..., Any], minter: TokenMinter
    ) -> None:
        client = asgi_client(notes_service(), secured(PERMIT_ALL, SERVICE_API_DOCS_PUBLIC="false"))
        asset = load_assets()["swagger-ui.css"]
        response = await client.get(
            f"/api/v1/docs/assets/{asset.name}", headers={"authorization": "Bearer " + minter.mint(sub="alice")}
        )
        assert response.headers["cache-control"] == "private, max-age=31536000, immutable"


class TestConfiguration:
    def test_env_override_protects_the_docs(self) -> None:
        assert open_settings().service.api_docs_public is True
        assert open_settings(environ={"SERVICE_API_DOCS_PUBLIC": "false"}).service.api_docs_public is False

    def test_a_string_is_not_a_boolean(self, tmp_path: Path) -> None:
        config = tmp_path / "service.toml"
        config.write_text('[service]\napi_docs_public = "no"\n')
        with pytest.raises(ConfigError) as raised:
            open_settings(config)
        assert str(raised.value).endswith("service.api_docs_public = 'no': expected true or false")

    @pytest.mark.parametrize(("environ", "expected"), [({}, "public"), ({"SERVICE_API_DOCS_PUBLIC": "0"}, "token")])
    def test_posture_says_whether_the_docs_are_public(self, environ: dict[str, str], expected: str) -> None:
        posture = Security.from_settings(open_settings(environ=environ), realm="x").posture()
        assert posture.fields()["api_docs"] == expected
        line = next(line for line in posture.lines() if line.startswith("api docs: "))
        assert line == (
            "api docs: public (<base_path>/v<N>/docs, /redoc, /openapi.json: no token, no policy decision)"
            if expected == "public"
            else "api docs: behind token auth and policy"
        )

    @pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json"])
    def test_a_business_route_on_a_docs_path_refuses_to_build(self, path: str) -> None:
        service = notes_service(path)
        with pytest.raises(ConfigError, match=f"the route /api/v1{path} of v1 takes the path of its API docs"):
            service.build(open_settings())


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        (b"gzip", True),
        (b"br, gzip;q=0.5", True),
        (b"GZIP", True),
        (b"gzip;q=0", False),
        (b"gzip; q=0.0", False),
        (b"br", False),
        (b"identity", False),
    ],
)
def test_accept_encoding_is_read_with_its_quality(value: bytes, accepted: bool) -> None:
    assert accepts_gzip({"headers": [(b"accept-encoding", value)]}) is accepted


def test_no_accept_encoding_means_no_gzip() -> None:
    assert accepts_gzip({"headers": []}) is False
