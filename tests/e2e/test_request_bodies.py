"""End to end: bodies a client breaks on purpose, against ``bastion run`` of the example: every one a 4xx in the
error shape, no error-level log line, and the service answers the next request."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from bastion.testing import TokenMinter
from tests.conftest import BastionProcess
from tests.e2e.test_documents_api import EXAMPLE

DOCUMENT = "/api/v2/documents/alice/doc-1"


@pytest.fixture(scope="module")
def example(module_bastion_process: Callable[..., BastionProcess], key_env: dict[str, str]) -> BastionProcess:
    return module_bastion_process(*EXAMPLE, env=key_env)


@pytest.fixture(scope="module")
def user(minter: TokenMinter) -> dict[str, str]:
    return {"authorization": "Bearer " + minter.mint(sub="alice", roles=["user"], ttl=3600)}


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        pytest.param(b"[" * 100_000 + b"]" * 100_000, 400, "JSON_TOO_DEEP", id="200-kb-of-nested-arrays"),
        pytest.param(b'{"title": "t", "content": ' + b"[" * 65 + b"]" * 65 + b"}", 400, "JSON_TOO_DEEP", id="65-deep"),
        pytest.param(b'{"title": "t", "content": "' + b"\xff" * 10 + b'"}', 400, "MALFORMED_BODY", id="not-utf8"),
        pytest.param(b'{"title": ', 400, "MALFORMED_BODY", id="not-json"),
        pytest.param(b'{"title": 5}', 422, "VALIDATION_ERROR", id="wrong-types"),
    ],
)
def test_a_broken_body_is_a_4xx_in_the_error_shape(
    example: BastionProcess, user: dict[str, str], body: bytes, status: int, code: str
) -> None:
    headers = {**user, "content-type": "application/json"}
    response = httpx.put(example.url + DOCUMENT, content=body, headers=headers, timeout=10)
    assert (response.status_code, response.json()["code"]) == (status, code)
    assert set(response.json()) == {"error", "code", "status"}
    assert httpx.get(example.url + DOCUMENT, headers=user, timeout=10).status_code == 200


def test_nested_json_leaves_no_error_in_the_log(example: BastionProcess, user: dict[str, str]) -> None:
    headers = {**user, "content-type": "application/json"}
    for _ in range(6):
        httpx.put(example.url + DOCUMENT, content=b"[" * 100_000 + b"]" * 100_000, headers=headers, timeout=10)
    example.wait_for_output('"status":400')
    lines = [json.loads(line) for line in example.output().splitlines() if line.startswith("{")]
    assert [line for line in lines if line["level"] in ("error", "critical")] == []
