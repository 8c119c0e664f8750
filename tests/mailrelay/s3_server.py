"""moto's S3 server mode, plus the one check of real S3 that moto leaves out: presigned URLs are verified.

moto (5.2) serves a presigned GET without looking at its signature or its expiry. Real S3 answers 403
`SignatureDoesNotMatch` for a URL signed with the wrong key or for the wrong request, and 403 `AccessDenied`
"Request has expired" once `X-Amz-Date` + `X-Amz-Expires` has passed. This WSGI layer does exactly that (SigV4
query authentication, RFC-style canonical request, the credentials from the environment) in front of moto's app,
so the tests can prove that the relay's presigned URLs download and expire. Run: python s3_server.py --port N
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import hmac
import os
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def _error(start_response: StartResponse, code: str, message: str) -> list[bytes]:
    body = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
    start_response("403 Forbidden", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
    return [body.encode()]


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def expected_signature(method: str, path: str, query: list[tuple[str, str]], host: str, secret: str) -> str:
    """SigV4 query-string signature of a presigned S3 request (host the only signed header, unsigned payload)."""
    params = dict(query)
    credential = params["X-Amz-Credential"].split("/")  # access key / date / region / service / aws4_request
    canonical_query = "&".join(
        f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
        for k, v in sorted(query)
        if k != "X-Amz-Signature"
    )
    canonical = "\n".join([method, path, canonical_query, f"host:{host}", "", "host", "UNSIGNED-PAYLOAD"])
    scope = "/".join(credential[1:])
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", params["X-Amz-Date"], scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = ("AWS4" + secret).encode()
    for part in credential[1:]:
        key = _hmac(key, part)
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def presign_checks(app: WsgiApp, secret: str) -> WsgiApp:
    def checked(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        query = urllib.parse.parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        params = dict(query)
        if "X-Amz-Signature" not in params:
            return app(environ, start_response)
        signed_at = datetime.datetime.strptime(params["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
        expires_at = signed_at + datetime.timedelta(seconds=int(params["X-Amz-Expires"]))
        if datetime.datetime.now(datetime.UTC) > expires_at:
            return _error(start_response, "AccessDenied", "Request has expired")
        path = environ.get("RAW_URI", environ.get("REQUEST_URI", environ["PATH_INFO"])).split("?", 1)[0]
        wanted = expected_signature(environ["REQUEST_METHOD"], path, query, environ["HTTP_HOST"], secret)
        if not hmac.compare_digest(wanted, params["X-Amz-Signature"]):
            return _error(start_response, "SignatureDoesNotMatch", "The request signature we calculated does not match")
        return app(environ, start_response)

    return checked


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(
        "127.0.0.1",
        args.port,
        presign_checks(app, os.environ["AWS_SECRET_ACCESS_KEY"]),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
