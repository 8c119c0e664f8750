"""Sunset enforcement and brownouts, pure: which instants answer 410 and with which message."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bastion import Brownout, ConfigError, Deprecation, Service
from bastion._metrics import Metrics
from tests.conftest import open_settings

SUNSET = datetime(2027, 6, 30, tzinfo=UTC).timestamp()
START = datetime(2027, 6, 1, tzinfo=UTC).timestamp()


def deprecation(**options: object) -> Deprecation:
    return Deprecation(replacement=2, sunset="2027-06-30T00:00:00Z", **options)  # type: ignore[arg-type]


def test_an_enforced_sunset_is_gone_from_its_instant_on() -> None:
    enforced = deprecation(enforce_sunset=True)
    assert enforced.gone(1, SUNSET - 1) is None
    assert (
        enforced.gone(1, SUNSET) == "API version v1 was sunset on 2027-06-30T00:00:00Z. Please migrate to version v2."
    )


def test_an_announced_sunset_never_answers_410() -> None:
    assert deprecation().gone(1, SUNSET + 86_400) is None


def test_a_brownout_answers_410_for_its_share_of_each_period() -> None:
    """share 0.25 of 3600 s: the first 900 s of each hour (hours counted from the epoch) from the start on."""
    browned = deprecation(brownout=Brownout(start="2027-06-01T00:00:00Z", share=0.25))
    assert browned.gone(1, START - 3600) is None  # before the start
    assert browned.gone(1, START + 899) is not None
    assert browned.gone(1, START + 900) is None
    assert browned.gone(1, START + 3600 + 10) is not None
    assert sum(browned.gone(1, START + second) is not None for second in range(0, 7200, 60)) == 30


@pytest.mark.parametrize(
    ("options", "message"),
    [
        pytest.param({"share": 0}, "brownout share 0 must be a fraction in (0, 1]", id="share-0"),
        pytest.param({"share": 1.5}, "brownout share 1.5", id="share-over-1"),
        pytest.param(
            {"share": 0.1, "period_secs": 10}, "brownout period_secs 10 must be an integer >= 60", id="period"
        ),
        pytest.param({"share": 0.1, "start": "soon"}, "brownout start 'soon' is not an RFC 3339", id="start"),
    ],
)
def test_a_bad_brownout_is_a_config_error(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Brownout(**{"start": "2027-06-01T00:00:00Z", **options})  # type: ignore[arg-type]
    assert str(caught.value).startswith(message)


def test_enforcement_needs_a_sunset() -> None:
    with pytest.raises(ConfigError, match="enforce_sunset and brownout need a sunset date"):
        Deprecation(replacement=2, enforce_sunset=True)


def test_a_brownout_starting_after_the_sunset_is_refused() -> None:
    with pytest.raises(ConfigError, match="is not before the sunset"):
        deprecation(brownout=Brownout(start="2027-07-01T00:00:00Z", share=0.1))


def test_rfc9745_form_carries_the_deprecation_date() -> None:
    headers = dict(deprecation(since="2026-01-01T00:00:00Z").headers(1, "rfc9745"))
    assert headers[b"deprecation"] == b"@1767225600"
    assert dict(deprecation().headers(1, "version"))[b"deprecation"] == b'version="v1"'


def test_callers_past_the_cap_count_as_other() -> None:
    metrics = Metrics(version_callers=2)
    for caller in ("client:a", "client:b", "client:c", "client:a", "client:d"):
        metrics.version_request(1, 2, caller)
    text = metrics.registry.get_sample_value
    labels = {"version": "v1", "deprecated": "true", "replacement_version": "v2"}
    assert text("api_version_requests_total", {**labels, "caller": "client:a"}) == 2
    assert text("api_version_requests_total", {**labels, "caller": "client:b"}) == 1
    assert text("api_version_requests_total", {**labels, "caller": "other"}) == 2


def test_rfc9745_form_without_a_deprecation_date_fails_at_start_up() -> None:
    service = Service("s")
    for number in (1, 2):

        @service.version(number).get("/x")
        async def x() -> None:
            return None

    service.deprecate(1, replacement=2)
    with pytest.raises(ConfigError) as caught:
        service.build(open_settings(environ={"SERVICE_DEPRECATION_HEADER": "rfc9745"}))
    assert str(caught.value) == (
        'service.deprecation_header = "rfc9745" needs the date v1 was deprecated: '
        'deprecate(1, ..., since="2026-01-01T00:00:00Z")'
    )
