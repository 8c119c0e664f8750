"""The circuit breaker state machine, row by row of the spec's table, with a clock moved by hand."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from bastion_core import BreakerState, CircuitBreaker, CircuitOpenError, ConfigError, Ticket
from bastion_core.testing import FakeClock


def breaker(clock: FakeClock, **kwargs: float) -> CircuitBreaker:
    options = {"threshold": 0.5, "min_requests": 4, "wait_secs": 30.0, "half_open_requests": 1, **kwargs}
    return CircuitBreaker("db", clock=clock, **options)  # type: ignore[arg-type]


def outcomes(b: CircuitBreaker, *results: bool) -> None:
    """Admit one call per result and record it (True = success)."""
    for success in results:
        b.record(b.admit(), success=success)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(0.0)


class TestClosed:
    def test_requests_pass_and_failures_are_counted(self, clock: FakeClock) -> None:
        b = breaker(clock)
        outcomes(b, True, False, True)
        assert (b.state, b.failure_rate) == (BreakerState.CLOSED, pytest.approx(1 / 3))

    def test_opens_when_the_rate_exceeds_the_threshold_over_min_requests(self, clock: FakeClock) -> None:
        b = breaker(clock)
        outcomes(b, False, True, False, False)  # 3 of 4 failed: 0.75 > 0.5
        assert b.state is BreakerState.OPEN

    def test_rate_equal_to_the_threshold_does_not_open(self, clock: FakeClock) -> None:
        b = breaker(clock)
        outcomes(b, False, True, False, True)  # 0.5 does not exceed 0.5
        assert b.state is BreakerState.CLOSED

    def test_fewer_than_min_requests_never_open(self, clock: FakeClock) -> None:
        b = breaker(clock)
        outcomes(b, False, False, False)  # 100 % but only 3 outcomes
        assert b.state is BreakerState.CLOSED

    def test_the_window_slides_over_the_last_min_requests_outcomes(self, clock: FakeClock) -> None:
        b = breaker(clock)
        outcomes(b, False, False, True, True)  # 0.5: stays closed
        outcomes(b, True, True)  # window now [T, T, T, T]: the old failures slid out
        assert (b.state, b.failure_rate) == (BreakerState.CLOSED, 0.0)
        outcomes(b, False, False)  # [T, T, F, F] = 0.5
        assert b.state is BreakerState.CLOSED
        outcomes(b, False)  # [T, F, F, F] = 0.75
        assert b.state is BreakerState.OPEN

    def test_threshold_zero_opens_on_any_failure_once_the_window_is_full(self, clock: FakeClock) -> None:
        b = breaker(clock, threshold=0.0)
        outcomes(b, True, True, True, False)
        assert b.state is BreakerState.OPEN

    def test_threshold_one_never_opens(self, clock: FakeClock) -> None:
        b = breaker(clock, threshold=1.0)
        outcomes(b, *([False] * 20))
        assert b.state is BreakerState.CLOSED


class TestOpen:
    @pytest.fixture
    def opened(self, clock: FakeClock) -> CircuitBreaker:
        b = breaker(clock)
        outcomes(b, False, False, False, False)
        assert b.state is BreakerState.OPEN
        return b

    def test_requests_fail_immediately_while_the_wait_runs(self, opened: CircuitBreaker, clock: FakeClock) -> None:
        clock.advance(29.5)
        with pytest.raises(CircuitOpenError) as info:
            opened.admit()
        assert info.value.retry_after == pytest.approx(0.5)
        assert str(info.value) == "circuit 'db' is open; retry in 1s"
        assert (opened.state, opened.rejected) == (BreakerState.OPEN, 1)

    def test_half_opens_once_the_wait_has_elapsed(self, opened: CircuitBreaker, clock: FakeClock) -> None:
        clock.advance(30)
        assert opened.state is BreakerState.HALF_OPEN
        assert opened.retry_after() == 0.0

    async def test_readiness_check_fails_while_open(self, opened: CircuitBreaker, clock: FakeClock) -> None:
        with pytest.raises(CircuitOpenError, match="circuit 'db' is open; retry in 30s"):
            await opened.ready()
        clock.advance(30)
        await opened.ready()  # Half-Open: the dependency gets its chance


class TestHalfOpen:
    @pytest.fixture
    def half_open(self, clock: FakeClock) -> CircuitBreaker:
        b = breaker(clock, half_open_requests=2)
        outcomes(b, False, False, False, False)
        clock.advance(30)
        assert b.state is BreakerState.HALF_OPEN
        return b

    def test_admits_only_the_half_open_budget(self, half_open: CircuitBreaker) -> None:
        first, second = half_open.admit(), half_open.admit()
        assert first.probe and second.probe
        with pytest.raises(CircuitOpenError):
            half_open.admit()
        assert half_open.rejected == 1

    def test_successful_test_requests_close_it(self, half_open: CircuitBreaker) -> None:
        first, second = half_open.admit(), half_open.admit()
        half_open.record(first, success=True)
        assert half_open.state is BreakerState.HALF_OPEN  # one of two test requests so far
        half_open.record(second, success=True)
        assert (half_open.state, half_open.failure_rate) == (BreakerState.CLOSED, 0.0)

    def test_a_failed_test_request_reopens_it(self, half_open: CircuitBreaker, clock: FakeClock) -> None:
        first, second = half_open.admit(), half_open.admit()
        half_open.record(first, success=False)
        assert half_open.state is BreakerState.OPEN
        assert half_open.retry_after() == 30.0
        half_open.record(second, success=True)  # from the earlier state: ignored
        assert half_open.state is BreakerState.OPEN

    def test_a_test_request_without_outcome_frees_its_slot(self, half_open: CircuitBreaker) -> None:
        first, _ = half_open.admit(), half_open.admit()
        half_open.record(first, success=None)
        third = half_open.admit()
        assert third.probe


class TestOutcomesAcrossTransitions:
    def test_a_slow_call_from_before_the_opening_does_not_count(self, clock: FakeClock) -> None:
        b = breaker(clock)
        slow = b.admit()
        outcomes(b, False, False, False, False)
        clock.advance(30)
        probe = b.admit()
        b.record(slow, success=True)  # admitted while Closed, long ago
        assert b.state is BreakerState.HALF_OPEN
        b.record(probe, success=True)
        assert b.state is BreakerState.CLOSED

    def test_stale_tickets_are_ignored(self, clock: FakeClock) -> None:
        b = breaker(clock)
        b.record(Ticket(generation=99, probe=False), success=False)
        assert b.failure_rate == 0.0


class TestSettings:
    @pytest.mark.parametrize(("threshold", "clamped"), [(-0.5, 0.0), (1.7, 1.0)])
    def test_threshold_outside_zero_one_is_clamped_with_a_warning(
        self, clock: FakeClock, threshold: float, clamped: float
    ) -> None:
        with capture_logs() as logs:
            b = breaker(clock, threshold=threshold)
        assert b.threshold == clamped
        assert logs == [
            {
                "event": "circuit_breaker_threshold_clamped",
                "breaker": "db",
                "threshold": threshold,
                "clamped": clamped,
                "log_level": "warning",
            }
        ]

    @pytest.mark.parametrize("key", ["min_requests", "wait_secs", "half_open_requests"])
    @pytest.mark.parametrize("value", [0, -1])
    def test_zero_or_negative_counts_and_durations_are_refused(self, clock: FakeClock, key: str, value: int) -> None:
        with pytest.raises(ConfigError) as info:
            breaker(clock, **{key: value})
        assert str(info.value) == f"circuit breaker 'db': {key} must be positive, got {value}"

    def test_transitions_are_logged_with_old_and_new_state_and_the_rate(self, clock: FakeClock) -> None:
        b = breaker(clock)
        with capture_logs() as logs:
            outcomes(b, False, False, False, True)
            clock.advance(30)
            b.record(b.admit(), success=True)
        assert [(e["old_state"], e["new_state"], e["failure_rate"]) for e in logs] == [
            ("closed", "open", 0.75),
            ("open", "half_open", 0.0),
            ("half_open", "closed", 0.0),
        ]
        assert {e["log_level"] for e in logs} == {"warning"}

    def test_snapshot(self, clock: FakeClock) -> None:
        b = breaker(clock)
        outcomes(b, False, True)
        snapshot = b.snapshot()
        assert (snapshot.name, snapshot.state, snapshot.failure_rate, snapshot.window) == (
            "db",
            BreakerState.CLOSED,
            0.5,
            2,
        )
