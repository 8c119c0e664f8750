"""Dead letters as the dead-letters command sees them: filters by route, error and age, durations, the records."""

from __future__ import annotations

import pytest

from mailrelay._dead_letters import DeadLetter, LetterFilter, parse_duration, shown_age

NOW = 1_800_000_000.0


def letter(**fields: object) -> DeadLetter:
    values: dict[str, object] = {
        "sequence": 7,
        "delivery_id": "0f" * 16,
        "route": "default",
        "error": "HTTP 500",
        "attempts": 25,
        "accepted_at": NOW - 7200,
        "dead_lettered_at": NOW - 3600,
        "body": b'{"subject":"hi"}',
        **fields,
    }
    return DeadLetter(**values)  # type: ignore[arg-type]


class TestLetterFilter:
    def test_no_criterion_selects_every_letter(self) -> None:
        assert LetterFilter().matches(letter(), now=NOW)

    def test_route_is_compared_case_insensitively(self) -> None:
        assert LetterFilter(route="Billing").matches(letter(route="billing"), now=NOW)
        assert not LetterFilter(route="billing").matches(letter(), now=NOW)

    def test_error_is_a_case_insensitive_substring(self) -> None:
        assert LetterFilter(error="http 5").matches(letter(), now=NOW)
        assert not LetterFilter(error="HTTP 422").matches(letter(), now=NOW)

    def test_age_bounds_count_from_the_dead_lettering(self) -> None:
        """The letter was dead-lettered an hour ago: older than 1 h (inclusive), not newer than 1 h."""
        assert LetterFilter(older_than=3600).matches(letter(), now=NOW)
        assert not LetterFilter(older_than=3601).matches(letter(), now=NOW)
        assert LetterFilter(newer_than=3601).matches(letter(), now=NOW)
        assert not LetterFilter(newer_than=3600).matches(letter(), now=NOW)

    def test_every_criterion_must_hold(self) -> None:
        assert not LetterFilter(route="default", error="timeout").matches(letter(), now=NOW)


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("2h", 7200.0), ("7d", 604800.0), ("1.5h", 5400.0)],
)
def test_durations(raw: str, seconds: float) -> None:
    assert parse_duration(raw) == seconds


@pytest.mark.parametrize("raw", ["", "h", "-5m", "5w", "1e9", "99999d"])
def test_bad_durations_say_what_is_expected(raw: str) -> None:
    with pytest.raises(ValueError, match="expected a duration"):
        parse_duration(raw)


def test_shown_age() -> None:
    assert [shown_age(s) for s in (-1, 42, 61, 3600 * 5 + 1, 86400 * 3)] == ["0s", "42s", "1m", "5h", "3d"]


def test_summary_and_detail() -> None:
    assert letter().summary() == {
        "sequence": 7,
        "delivery_id": "0f" * 16,
        "route": "default",
        "error": "HTTP 500",
        "attempts": 25,
        "accepted_at": "2027-01-15T06:00:00Z",
        "dead_lettered_at": "2027-01-15T07:00:00Z",
        "size_bytes": 16,
    }
    assert letter().detail()["payload"] == {"subject": "hi"}
    assert letter(body=b"\xffnot json").detail()["payload_text"] == "\ufffdnot json"
