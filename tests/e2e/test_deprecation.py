"""End to end over ``bastion run``: sunset enforcement (410 Gone with the successor link), brownouts, the start-up
warning, RFC 9745's ``Deprecation`` form, ``api_version_requests`` by caller and ``bastion deprecations report``."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable

import httpx
import pytest

from bastion._cli import main
from bastion.testing import TokenMinter
from tests.conftest import BastionProcess, metric_samples, metric_series

APP = "tests.e2e.apps.sunset_service:service"
SCRAPE_WITHIN_SECS = 15.0


def environment(key_env: dict[str, str]) -> dict[str, str]:
    return {**key_env, "SERVICE_METRICS_VERSION_CALLERS": "100", "SERVICE_DEPRECATION_HEADER": "rfc9745"}


@pytest.fixture(scope="module")
def sunset(module_bastion_process: Callable[..., BastionProcess], key_env: dict[str, str]) -> BastionProcess:
    return module_bastion_process(APP, env=environment(key_env))


def bearer(minter: TokenMinter, sub: str, **claims: object) -> dict[str, str]:
    return {"authorization": "Bearer " + minter.mint(sub=sub, roles=["user"], **claims)}


def test_past_an_enforced_sunset_the_version_is_gone(sunset: BastionProcess, minter: TokenMinter) -> None:
    response = httpx.get(sunset.url + "/api/v1/items", headers=bearer(minter, "alice"))
    assert (response.status_code, response.json()) == (
        410,
        {
            "error": "API version v1 was sunset on 2020-01-01T00:00:00Z. Please migrate to version v4.",
            "code": "GONE",
            "status": 410,
        },
    )
    assert response.headers["link"] == '</v4/>; rel="successor-version"'
    assert response.headers["sunset"] == "Wed, 01 Jan 2020 00:00:00 GMT"


def test_a_brownout_slot_answers_410_before_the_sunset(sunset: BastionProcess, minter: TokenMinter) -> None:
    response = httpx.get(sunset.url + "/api/v2/items", headers=bearer(minter, "alice"))
    assert response.status_code == 410
    assert response.json()["error"] == (
        "API version v2 is browned out ahead of its sunset on 2099-01-01T00:00:00Z. Please migrate to version v4."
    )
    assert response.headers["link"] == '</v4/>; rel="successor-version"'


def test_an_announced_sunset_only_marks_the_version(sunset: BastionProcess, minter: TokenMinter) -> None:
    response = httpx.get(sunset.url + "/api/v3/items", headers=bearer(minter, "alice"))
    assert (response.status_code, response.json()) == (200, ["a"])
    assert response.headers["deprecation"] == "@1546300800"  # RFC 9745: 2019-01-01T00:00:00Z
    assert httpx.get(sunset.url + "/api/v4/items", headers=bearer(minter, "alice")).status_code == 200


def test_start_up_warns_of_the_enforced_sunset_that_has_passed(sunset: BastionProcess) -> None:
    events = [json.loads(line) for line in sunset.output().splitlines() if line.startswith("{")]
    passed = [event for event in events if event.get("event") == "api_version_sunset_passed"]
    assert [(event["version"], event["level"]) for event in passed] == [("v1", "warning")]


def test_version_requests_by_caller_and_the_report(
    sunset: BastionProcess, minter: TokenMinter, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each caller of v5 (which no other test calls) is counted by name; the report lists them. The cap
    (``other``) is tested on the counter itself (tests/bastion/routing/test_sunset.py)."""
    for sub, claims in [("bob", {"client_id": "mobile"}), ("carol", {}), ("carol", {})]:
        assert httpx.get(sunset.url + "/api/v5/items", headers=bearer(minter, sub, **claims)).status_code == 200
    deadline = time.monotonic() + SCRAPE_WITHIN_SECS
    while True:
        samples = metric_samples(httpx.get(sunset.url + "/metrics").text)
        series = metric_series(
            samples, "api_version_requests_total", "version", "deprecated", "replacement_version", "caller"
        )
        v5 = {key[3]: value for key, value in series.items() if key[0] == "v5"}
        if sum(v5.values()) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    carol = "sub:" + hashlib.sha256(b"carol").hexdigest()[:16]
    assert v5 == {carol: 2, "client:mobile": 1}
    assert main(["deprecations", "report", "--metrics", sunset.url + "/metrics"]) == 0
    report = capsys.readouterr().out
    assert (
        "v5 (deprecated, replacement v4): 3 requests from 2 callers\n"
        f"           2  {carol}\n"
        "           1  client:mobile\n"
    ) in report


def test_a_report_from_a_url_that_is_not_http_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deprecations", "report", "--metrics", "ftp://example.test/metrics"]) == 2
    assert capsys.readouterr().err == (
        "error: --metrics 'ftp://example.test/metrics' must be an http:// or https:// URL, e.g. "
        "http://127.0.0.1:8080/metrics\n"
    )
