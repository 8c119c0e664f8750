"""Circuit breaker transitions with a hand-moved clock (no sleeping)."""

from __future__ import annotations

import pytest

from mailrelay._breaker import BreakerState, CircuitBreaker
from mailrelay.testing import FakeClock


def make(clock: FakeClock, threshold: int = 3, reset_after: float = 60) -> CircuitBreaker:
    return CircuitBreaker(threshold=threshold, reset_after=reset_after, clock=clock)


class TestBreakerTransitions:
    def test_starts_closed_and_allows(self, clock: FakeClock) -> None:
        breaker = make(clock)
        assert breaker.state is BreakerState.CLOSED
        assert breaker.allow()

    def test_opens_after_threshold_consecutive_failures(self, clock: FakeClock) -> None:
        breaker = make(clock)
        for _ in range(2):
            breaker.record_failure()
        assert breaker.allow()
        breaker.record_failure()
        assert breaker.state is BreakerState.OPEN
        assert not breaker.allow()

    def test_success_resets_the_count(self, clock: FakeClock) -> None:
        breaker = make(clock)
        breaker.record_failure()
        breaker.record_failure()
        breaker.record_success()
        breaker.record_failure()
        breaker.record_failure()
        assert breaker.state is BreakerState.CLOSED

    def test_half_open_after_reset_lets_exactly_one_probe(self, clock: FakeClock) -> None:
        breaker = make(clock, threshold=1)
        breaker.record_failure()
        clock.advance(59.9)
        assert not breaker.allow()
        assert breaker.retry_in() == pytest.approx(0.1)
        clock.advance(0.1)
        assert breaker.state is BreakerState.HALF_OPEN
        assert breaker.allow()
        assert not breaker.allow()  # the probe is in flight

    def test_probe_success_closes(self, clock: FakeClock) -> None:
        breaker = make(clock, threshold=1)
        breaker.record_failure()
        clock.advance(60)
        assert breaker.allow()
        breaker.record_success()
        assert breaker.state is BreakerState.CLOSED
        assert breaker.allow() and breaker.allow()

    def test_probe_failure_reopens_for_another_period(self, clock: FakeClock) -> None:
        breaker = make(clock, threshold=5)
        for _ in range(5):
            breaker.record_failure()
        clock.advance(60)
        assert breaker.allow()
        breaker.record_failure()  # a single failure in half-open is enough
        assert breaker.state is BreakerState.OPEN
        clock.advance(59)
        assert not breaker.allow()
        clock.advance(1)
        assert breaker.allow()

    @pytest.mark.parametrize(("threshold", "reset_after"), [(0, 1.0), (1, 0.0)])
    def test_invalid_arguments(self, threshold: int, reset_after: float) -> None:
        with pytest.raises(ValueError, match="must be"):
            CircuitBreaker(threshold=threshold, reset_after=reset_after)
