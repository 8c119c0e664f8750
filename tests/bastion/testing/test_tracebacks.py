"""A failing test that uses ServiceClient shows no bearer token: neither in a repr nor in the traceback of a 500."""

from __future__ import annotations

import pytest
import structlog

from bastion import Service
from bastion.testing import ServiceClient

FAILING_TEST = """
from bastion import Service
from bastion.testing import ServiceClient

service = Service("traceback-demo")
v1 = service.version(1)

@v1.get("/boom")
async def boom() -> dict[str, str]:
    raise RuntimeError("kaboom")

def test_boom() -> None:
    with ServiceClient(service, environ={"SERVICE_TOKEN_ALGORITHM": "RS256"}) as client:
        assert client.as_user("alice").get("/api/v1/boom").status_code == 200
"""


def test_the_repr_of_a_user_client_masks_its_token() -> None:
    service = Service("repr-demo")
    service.version(1)
    with ServiceClient(service, environ={"SERVICE_TOKEN_ALGORITHM": "RS256"}) as client:
        alice = client.as_user("alice")
        token = alice.headers["authorization"].removeprefix("Bearer ")
        assert token not in repr(alice.headers) and token not in repr(alice)


def test_a_500_in_a_failing_test_shows_its_traceback_without_locals_or_token(pytester: pytest.Pytester) -> None:
    """pytest ``-l`` shows the test's locals; the logged 500 shows the traceback as text, no frame's locals (the
    request's headers among them)."""
    pytester.makepyfile(test_failing=FAILING_TEST)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    saved = structlog.get_config()
    structlog.reset_defaults()  # as in a user's test run: structlog's own defaults show every frame's locals
    try:
        result = pytester.runpytest_inprocess("-l", "-p", "no:cacheprovider")
    finally:
        structlog.configure(**saved)
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output
    assert 'raise RuntimeError("kaboom")\nRuntimeError: kaboom' in output
    assert "eyJ" not in output  # the start of every JWT: its header, base64url-encoded
    assert "Bearer" not in output
