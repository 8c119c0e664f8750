"""What ``bastion._compat.starlette`` assumes of Starlette's internals, checked on the installed version (verified
on Starlette 1.10.0): an upgrade that changes one fails here, by name.

Assumptions: ``Request.body()`` keeps the body it read in ``Request._body`` (absent before), and ``Request.json()``
returns ``Request._json`` when set without parsing the body again.
"""

from __future__ import annotations

import pytest
import starlette
from starlette.requests import Request

from bastion._compat import starlette as starlette_compat
from bastion.types import Message


def request(body: bytes) -> Request:
    sent = False

    async def receive() -> dict[str, object]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""}, receive)


# Starlette release -> whether it records a route's body size limit in the scope (starlette.middleware.body_limit).
BODY_LIMIT = {"1.10.0": True, "0.50.0": False, "0.37.2": False}
"""1.10.0: the newest (`make test`); 0.50.0 and 0.37.2: `make compat`'s middle and oldest sets."""


def test_the_version_is_one_verified() -> None:
    assert starlette.__version__ in BODY_LIMIT, (
        "re-check bastion/_compat/starlette.py against this Starlette, then update"
    )


def test_the_body_limit_key_is_read_where_starlette_has_one() -> None:
    assert (starlette_compat.MAX_BODY_SIZE_SCOPE_KEY is not None) is BODY_LIMIT[starlette.__version__]
    assert not starlette_compat.body_size_limited({"type": "http"})


def test_the_hooks_are_there() -> None:
    assert starlette_compat.supported()
    assert {"_body", "_json"} == starlette_compat.PRIVATE_NAMES


async def test_the_body_read_is_kept() -> None:
    req = request(b'{"a": 1}')
    assert starlette_compat.body_read(req) is None
    assert await req.body() == b'{"a": 1}'
    assert starlette_compat.body_read(req) == b'{"a": 1}'


async def test_a_remembered_body_is_what_body_and_stream_return_without_receiving() -> None:
    async def receive() -> Message:
        raise AssertionError("the body was handed over: nothing to receive")

    req = Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)
    starlette_compat.remember_body(req, b'{"a": 1}')
    assert await req.body() == b'{"a": 1}'
    assert [chunk async for chunk in req.stream()] == [b'{"a": 1}', b""]
    assert starlette_compat.body_read(req) == b'{"a": 1}'


async def test_a_remembered_json_is_what_json_returns() -> None:
    req = request(b"not json")
    await req.body()
    starlette_compat.remember_json(req, {"parsed": True})
    assert await req.json() == {"parsed": True}


def test_without_the_cache_the_hooks_are_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(self: Request) -> bytes:
        return b""

    monkeypatch.setattr(starlette_compat, "Request", type("Request", (), {"body": body, "json": body}))
    assert not starlette_compat.supported()
