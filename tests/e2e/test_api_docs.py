"""End to end: the API docs of ``bastion run`` of the example over a real socket, and schemathesis against it."""

from __future__ import annotations

import re
from collections.abc import Callable
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from bastion.testing import TokenMinter
from tests.conftest import BastionProcess
from tests.e2e import schemathesis_example
from tests.e2e.schemathesis_example import EXAMPLE

CONTENT_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".json": "application/json",
}
# What would make a browser fetch from another origin: an absolute or scheme-relative URL in a CSS url() or
# @import, anywhere in the HTML.
CSS_REMOTE = re.compile(r"""(url\(\s*['"]?|@import\s+['"])\s*(https?:)?//""", re.IGNORECASE)
ABSOLUTE_URL = re.compile(r"(https?:)?//", re.IGNORECASE)
HTTP_URL = re.compile(r"https?://", re.IGNORECASE)


class Links(HTMLParser):
    """The URLs a page makes the browser load: script src, link href and the ReDoc spec-url."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        wanted = {"script": "src", "link": "href", "redoc": "spec-url", "div": "data-openapi-url"}.get(tag)
        self.urls.extend(value for name, value in attrs if name == wanted and value is not None)


def loaded_urls(page: httpx.Response) -> list[str]:
    parser = Links()
    parser.feed(page.text)
    return [urljoin(str(page.url), url) for url in parser.urls]


@pytest.fixture(scope="module")
def example(module_bastion_process: Callable[..., BastionProcess], key_env: dict[str, str]) -> BastionProcess:
    """The example as `make run` starts it: the spec's default token rules and the example's policies."""
    return module_bastion_process(*EXAMPLE, env=key_env)


class TestPublicByDefault:
    @pytest.mark.parametrize("path", ["/api/v2/docs", "/api/v2/redoc", "/api/v1/docs", "/api/v1/redoc"])
    def test_page_needs_no_token(self, example: BastionProcess, path: str) -> None:
        page = httpx.get(example.url + path)
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert page.headers["cache-control"] == "no-cache"
        assert page.headers["content-security-policy"].startswith("default-src 'none'; script-src 'self';")

    @pytest.mark.parametrize("page_path", ["/api/v2/docs", "/api/v2/redoc"])
    def test_page_loads_only_what_the_service_serves(self, example: BastionProcess, page_path: str) -> None:
        """Every URL the page loads is on the service and answers 200 with its content type; nothing in the
        HTML or CSS points a browser at another origin."""
        page = httpx.get(example.url + page_path)
        assert ABSOLUTE_URL.search(page.text) is None
        urls = loaded_urls(page)
        assert len(urls) == (5 if page_path.endswith("/docs") else 3)
        for url in urls:
            assert urlsplit(url).netloc == urlsplit(example.url).netloc, url
            response = httpx.get(url)
            assert response.status_code == 200, url
            suffix = "." + url.rsplit(".", 1)[-1]
            assert response.headers["content-type"] == CONTENT_TYPES[suffix], url
            if suffix == ".css":
                assert CSS_REMOTE.search(response.text) is None
            if suffix != ".json":
                assert response.headers["cache-control"] == "public, max-age=31536000, immutable"

    def test_swagger_ui_start_up_script_names_no_other_origin(self, example: BastionProcess) -> None:
        page = httpx.get(example.url + "/api/v2/docs")
        script = next(url for url in loaded_urls(page) if "swagger-init." in url)
        text = httpx.get(script).text
        assert HTTP_URL.search(text) is None
        assert "validatorUrl: null" in text

    def test_assets_are_sent_gzipped_to_clients_that_accept_it(self, example: BastionProcess) -> None:
        page = httpx.get(example.url + "/api/v2/redoc")
        script = next(url for url in loaded_urls(page) if url.endswith(".js"))
        identity = httpx.get(script, headers={"accept-encoding": "identity"})
        gzipped = httpx.get(script, headers={"accept-encoding": "gzip"})
        assert "content-encoding" not in identity.headers
        assert gzipped.headers["content-encoding"] == "gzip"
        assert int(gzipped.headers["content-length"]) < int(identity.headers["content-length"])
        assert gzipped.content == identity.content  # httpx decodes it

    def test_document_declares_the_bearer_scheme(self, example: BastionProcess) -> None:
        document = httpx.get(example.url + "/api/v2/openapi.json").json()
        assert document["components"]["securitySchemes"] == {
            "bearerAuth": {
                "type": "http",
                "scheme": "bearer",
                "bearerFormat": "JWT",
                "description": "Authorization: Bearer <token>, as the token service issued it.",
            }
        }
        assert document["paths"]["/api/v2/documents"]["get"]["security"] == [{"bearerAuth": []}]


class TestProtected:
    def test_docs_need_a_token_and_a_permit(
        self, bastion_process: Callable[..., BastionProcess], key_env: dict[str, str], minter: TokenMinter
    ) -> None:
        process = bastion_process(*EXAMPLE, env={**key_env, "SERVICE_API_DOCS_PUBLIC": "false"})
        anonymous = httpx.get(process.url + "/api/v2/docs")
        assert anonymous.status_code == 401
        assert anonymous.json() == {"error": "Missing bearer token", "code": "UNAUTHORIZED", "status": 401}
        user = {"authorization": "Bearer " + minter.mint(sub="alice", roles=["user"])}
        denied = httpx.get(process.url + "/api/v2/docs", headers=user)
        assert denied.status_code == 403  # the example's policies permit no user the docs page
        admin = {"authorization": "Bearer " + minter.mint(sub="root", roles=["admin"])}
        page = httpx.get(process.url + "/api/v2/docs", headers=admin)
        assert page.status_code == 200
        asset = httpx.get(loaded_urls(page)[0], headers=admin)
        assert asset.status_code == 200
        assert asset.headers["cache-control"] == "private, max-age=31536000, immutable"


@pytest.mark.slow
@pytest.mark.parametrize("version", schemathesis_example.VERSIONS)
def test_schemathesis_finds_no_failure(example: BastionProcess, minter: TokenMinter, version: int) -> None:
    """Every check of schemathesis over every operation of the version: no undocumented status, header,
    content type or body, no 5xx; bounded by MAX_EXAMPLES and a fixed seed."""
    token = minter.mint(sub="alice", roles=["user"], ttl=3600)
    code, report, output = schemathesis_example.run(example.url, version, token)
    assert (code, report["failures"], report["errors"]) == (0, [], []), output
    assert report["operations"] == {
        "total": 6,
        "selected": 6,
        "tested": 6,
        "errored": 0,
        "skipped": 0,
        "skip_reasons": [],
    }
    assert report["test_cases"]["with_failures"] == 0
    assert report["warnings"]["unsupported_regex"] == []
