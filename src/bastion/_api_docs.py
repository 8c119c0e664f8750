"""Each version's API docs: the OpenAPI document, Swagger UI and ReDoc, with every file they load served here.

Per version (``{base_path}/v<N>``): ``/openapi.json``, ``/docs`` (Swagger UI), ``/redoc`` (ReDoc) and
``/docs/assets/<file>``. The Swagger UI and ReDoc files are vendored in ``_docs_assets/`` (its README names the
versions, licences and how to refresh them), read once per process and never from disk per request: the pages
fetch nothing from the internet, and their Content-Security-Policy keeps a browser to this origin. Asset names
carry a hash of their content, so browsers may keep them for a year. With ``service.api_docs_public`` (the
default) these routes need no token and no policy decision (they are rate limited like any public path).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import html
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from bastion._responses import json_body, send_response
from bastion.errors import ConfigError
from bastion.routing._openapi import Gates, complete_openapi, segment_parameters
from bastion.routing._resolve import DOCS_ASSET_ROUTE, RouteEntry
from bastion.routing._versioned import VersionedApi
from bastion.types import ASGIApp, Headers, Receive, Scope, Send

ASSETS_DIR = Path(__file__).with_name("_docs_assets")
JS, CSS, PNG = b"text/javascript; charset=utf-8", b"text/css; charset=utf-8", b"image/png"
ASSET_FILES: Mapping[str, tuple[str, bytes]] = {
    "swagger-ui-bundle.js": ("swagger-ui/swagger-ui-bundle.js", JS),
    "swagger-ui.css": ("swagger-ui/swagger-ui.css", CSS),
    "favicon.png": ("swagger-ui/favicon-32x32.png", PNG),
    "swagger-init.js": ("swagger-init.js", JS),
    "redoc.standalone.js": ("redoc/redoc.standalone.js", JS),
}
"""``{logical name: (file under _docs_assets/, content type)}``."""
DOCS_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
"""The pages load only what this origin serves (no CDN, fonts or validator badge). Inline styles are allowed:
Swagger UI sets style attributes and ReDoc injects style elements; ReDoc's search runs in a blob: worker."""
ASSET_MAX_AGE = 31_536_000
HTML = b"text/html; charset=utf-8"
JSON = b"application/json"
# A page or document may change with the next start (or a deprecation while serving): revalidate each time.
NO_CACHE = (b"cache-control", b"no-cache")


class Asset:
    """One vendored file, its content-hashed public name and (made on first use, then kept) its gzip form."""

    __slots__ = ("_gzipped", "body", "content_type", "name")

    def __init__(self, logical: str, body: bytes, content_type: bytes) -> None:
        stem, dot, suffix = logical.rpartition(".")
        self.name = f"{stem}.{hashlib.sha256(body).hexdigest()[:12]}{dot}{suffix}"
        self.body = body
        self.content_type = content_type
        self._gzipped: bytes | None = None

    @property
    def compressible(self) -> bool:
        return self.content_type != PNG

    def gzipped(self) -> bytes:
        """The body gzipped, once per process (the compression step passes an encoded response through)."""
        if self._gzipped is None:
            self._gzipped = gzip.compress(self.body, compresslevel=9, mtime=0)
        return self._gzipped


@functools.cache
def load_assets() -> dict[str, Asset]:
    """Every vendored file, read once per process. A missing file is a broken install: ConfigError naming it."""
    assets: dict[str, Asset] = {}
    for logical, (relative, content_type) in ASSET_FILES.items():
        path = ASSETS_DIR / relative
        try:
            body = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"API docs asset {path} cannot be read ({exc.strerror}): reinstall bastion") from None
        assets[logical] = Asset(logical, body, content_type)
    return assets


def accepts_gzip(scope: Scope) -> bool:
    """Whether ``Accept-Encoding`` lists gzip with a quality above zero (RFC 9110 12.5.3)."""
    for name, value in scope["headers"]:
        if name == b"accept-encoding":
            for item in value.decode("latin-1").lower().split(","):
                coding, _, params = item.partition(";")
                if coding.strip() == "gzip":
                    return _quality(params) > 0
            return False
    return False


def _quality(params: str) -> float:
    for param in params.split(";"):
        key, _, value = param.strip().partition("=")
        if key == "q":
            try:
                return float(value)
            except ValueError:
                return 0.0
    return 1.0


def _asset_app(asset: Asset, cache_control: bytes) -> ASGIApp:
    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        encoded = asset.compressible and accepts_gzip(scope)
        body = asset.gzipped() if encoded else asset.body
        headers: Headers = [
            (b"content-type", asset.content_type),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", cache_control),
        ]
        if asset.compressible:
            headers.append((b"vary", b"accept-encoding"))
        if encoded:
            headers.append((b"content-encoding", b"gzip"))
        await send_response(send, 200, headers, body, head=scope["method"] == "HEAD")

    return serve


def _page_app(body: bytes) -> ASGIApp:
    headers: Headers = [
        (b"content-type", HTML),
        (b"content-length", str(len(body)).encode()),
        NO_CACHE,
        (b"content-security-policy", DOCS_CSP.encode()),
    ]

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        await send_response(send, 200, headers, body, head=scope["method"] == "HEAD")

    return serve


def swagger_page(title: str, assets: Mapping[str, Asset]) -> bytes:
    """Swagger UI for the document at ``openapi.json`` beside the page; every URL is relative to the page, so
    the docs work under any mount point. ``swagger-init.js`` reads the document URL from the page (no inline
    script)."""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<link rel="stylesheet" href="docs/assets/{assets["swagger-ui.css"].name}">
<link rel="icon" type="image/png" href="docs/assets/{assets["favicon.png"].name}">
</head>
<body>
<div id="swagger-ui" data-openapi-url="openapi.json"></div>
<script src="docs/assets/{assets["swagger-ui-bundle.js"].name}"></script>
<script src="docs/assets/{assets["swagger-init.js"].name}"></script>
</body>
</html>
""".encode()


def redoc_page(title: str, assets: Mapping[str, Asset]) -> bytes:
    """ReDoc for the document at ``openapi.json`` beside the page (the ``<redoc>`` element starts it)."""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<link rel="icon" type="image/png" href="docs/assets/{assets["favicon.png"].name}">
</head>
<body>
<redoc spec-url="openapi.json"></redoc>
<script src="docs/assets/{assets["redoc.standalone.js"].name}"></script>
</body>
</html>
""".encode()


class ApiDocs:
    """The docs routes of one built app: per version the completed OpenAPI document, the two pages, the assets.

    ``gates(number)`` says what the pipeline does in front of that version (for the documented answers).
    The completed document is built on first request and kept until the version's FastAPI document changes
    (a deprecation while serving).
    """

    def __init__(
        self,
        api: VersionedApi,
        *,
        base_path: str,
        title: str,
        version: str,
        public: bool,
        gates: Callable[[int], Gates],
    ) -> None:
        self.api = api
        self.base_path = base_path
        self.title = title
        self.version = version
        self.public = public
        self.gates = gates
        self.assets = load_assets()
        self._segments: dict[int, dict[str, frozenset[str]]] = {}
        self._served: dict[int, tuple[dict[str, Any], str, bytes]] = {}
        """Per version: FastAPI's document (compared by identity) and the completed one's JSON bytes."""
        self._cache_control = b"%s, max-age=%d, immutable" % (b"public" if public else b"private", ASSET_MAX_AGE)

    def entries(self, number: int, routes: Iterable[RouteEntry]) -> list[RouteEntry]:
        """The docs routes of version ``number``, whose business routes are ``routes``.

        Raises ConfigError when a business route takes one of these paths (it would be shadowed)."""
        prefix = self.api.prefix(number, self.base_path)
        routes = list(routes)
        self._segments[number] = segment_parameters(routes)
        label = f"{self.title} v{number}"
        handlers: dict[str, tuple[str, ASGIApp]] = {
            f"{prefix}/openapi.json": (f"openapi_v{number}", self._openapi_app(number)),
            f"{prefix}/docs": (f"swagger_ui_v{number}", _page_app(swagger_page(f"{label} - Swagger UI", self.assets))),
            f"{prefix}/redoc": (f"redoc_v{number}", _page_app(redoc_page(f"{label} - ReDoc", self.assets))),
        }
        for asset in self.assets.values():
            handlers[f"{prefix}/docs/assets/{asset.name}"] = (DOCS_ASSET_ROUTE, _asset_app(asset, self._cache_control))
        for route in routes:
            if route.path in handlers and not route.websocket:
                raise ConfigError(
                    f"the route {route.path} of v{number} takes the path of its API docs ({prefix}/openapi.json, "
                    f"{prefix}/docs, {prefix}/redoc and {prefix}/docs/assets/*): give the route another path"
                )
        return [
            RouteEntry(
                path=path,
                methods=frozenset({"GET", "HEAD"}),
                version=number,
                name=name,
                handler=handler,
                public=self.public,
            )
            for path, (name, handler) in handlers.items()
        ]

    def _document_body(self, number: int) -> bytes:
        """Version ``number``'s document with the pipeline's answers (bastion.routing._openapi), as JSON."""
        raw = self.api.openapi(number, base_path=self.base_path, title=self.title, version=self.version)
        served = self._served.get(number)
        gates = self.gates(number)
        if served is None or served[0] is not raw or served[1] != gates.policy_digest:
            completed = complete_openapi(raw, gates=gates, segment_params=self._segments[number])
            served = (raw, gates.policy_digest, json_body(completed))
            self._served[number] = served
        return served[2]

    def _openapi_app(self, number: int) -> ASGIApp:
        async def serve(scope: Scope, receive: Receive, send: Send) -> None:
            body = self._document_body(number)
            headers: Headers = [(b"content-type", JSON), (b"content-length", str(len(body)).encode()), NO_CACHE]
            await send_response(send, 200, headers, body, head=scope["method"] == "HEAD")

        return serve
