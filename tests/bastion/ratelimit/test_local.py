"""The local GCRA limiter: burst, refill, no double burst at window edges, headers, bounded memory."""

from __future__ import annotations

import pytest

from bastion.ratelimit._buckets import Bucket
from bastion.ratelimit._local import LocalLimiter, gcra
from bastion.ratelimit._rules import Quota
from bastion.testing import FakeClock


def limiter(clock: FakeClock, **kwargs: object) -> LocalLimiter:
    return LocalLimiter(clock=clock, wall_clock=clock, **kwargs)  # type: ignore[arg-type]


def bucket(quota: Quota, key: str = "rate_limit:user:alice:60") -> Bucket:
    return Bucket(key=key, quota=quota)


def allowed_count(store: LocalLimiter, target: Bucket, attempts: int) -> int:
    return sum(store.charge_now(target).allowed for _ in range(attempts))


class TestGcra:
    def test_burst_passes_at_once_then_refuses(self, clock: FakeClock) -> None:
        store = limiter(clock)
        assert allowed_count(store, bucket(Quota.per_minute(10)), 25) == 10

    def test_explicit_burst_smaller_than_the_limit(self, clock: FakeClock) -> None:
        store = limiter(clock)
        assert allowed_count(store, bucket(Quota.per_minute(60, burst=3)), 10) == 3

    def test_refills_one_request_per_interval(self, clock: FakeClock) -> None:
        store, target = limiter(clock), bucket(Quota.per_minute(10))
        allowed_count(store, target, 10)
        clock.advance(5.9)
        assert not store.charge_now(target).allowed
        clock.advance(0.1)  # 60 s / 10 = one request every 6 s
        assert store.charge_now(target).allowed
        assert not store.charge_now(target).allowed

    def test_full_again_after_the_window(self, clock: FakeClock) -> None:
        store, target = limiter(clock), bucket(Quota.per_minute(10))
        allowed_count(store, target, 10)
        clock.advance(60)
        assert allowed_count(store, target, 25) == 10

    def test_no_double_burst_at_the_window_edge(self, clock: FakeClock) -> None:
        """A fixed window would allow 10 at 59.9 s and 10 more at 60.1 s; GCRA allows none at 60.1 s."""
        store, target = limiter(clock), bucket(Quota.per_minute(10))
        clock.advance(59.9)
        assert allowed_count(store, target, 10) == 10
        clock.advance(0.2)
        assert allowed_count(store, target, 10) == 0

    def test_steady_rate_over_a_long_run(self, clock: FakeClock) -> None:
        """Hammering for 10 minutes gets the burst plus one request per 6 s interval (at 6, 12, ... 594 s)."""
        store, target = limiter(clock), bucket(Quota.per_minute(10))
        passed = 0
        for _ in range(6000):
            passed += store.charge_now(target).allowed
            clock.advance(0.1)
        assert passed == 10 + 99

    @pytest.mark.parametrize(
        ("quota", "interval"),
        [
            pytest.param(Quota.per_second(4), 0.25, id="per-second"),
            pytest.param(Quota.per_minute(30), 2.0, id="per-minute"),
            pytest.param(Quota.per_hour(360), 10.0, id="per-hour"),
        ],
    )
    def test_presets(self, clock: FakeClock, quota: Quota, interval: float) -> None:
        store, target = limiter(clock), bucket(quota)
        assert allowed_count(store, target, quota.limit + 5) == quota.limit
        clock.advance(interval)
        assert allowed_count(store, target, 3) == 1

    def test_separate_keys_are_separate_buckets(self, clock: FakeClock) -> None:
        store = limiter(clock)
        assert allowed_count(store, bucket(Quota.per_minute(2), "a"), 5) == 2
        assert allowed_count(store, bucket(Quota.per_minute(2), "b"), 5) == 2


class TestOutcome:
    def test_remaining_counts_down(self, clock: FakeClock) -> None:
        store, target = limiter(clock), bucket(Quota.per_minute(3))
        assert [store.charge_now(target).remaining for _ in range(3)] == [2, 1, 0]

    def test_reset_is_when_the_bucket_is_full_again(self, clock: FakeClock) -> None:
        store, target = limiter(clock), bucket(Quota.per_minute(10))
        first = store.charge_now(target)
        assert first.reset_at == pytest.approx(clock.now + 6)
        store.charge_now(target)
        assert store.charge_now(target).reset_at == pytest.approx(clock.now + 18)
        assert first.limit == 10

    def test_refusal_says_when_to_retry(self, clock: FakeClock) -> None:
        store, target = limiter(clock), bucket(Quota.per_minute(10))
        allowed_count(store, target, 10)
        clock.advance(1.5)
        refused = store.charge_now(target)
        assert not refused.allowed
        assert refused.retry_after == pytest.approx(4.5)
        assert refused.retry_after_secs == 5
        assert refused.reset_at == pytest.approx(clock.now + 58.5)

    def test_waiting_retry_after_is_enough(self, clock: FakeClock) -> None:
        store, target = limiter(clock), bucket(Quota.per_second(1))
        assert store.charge_now(target).allowed
        refused = store.charge_now(target)
        clock.advance(refused.retry_after_secs)
        assert store.charge_now(target).allowed

    async def test_charge_is_the_async_face(self, clock: FakeClock) -> None:
        outcome = await limiter(clock).charge(bucket(Quota.per_minute(1)))
        assert outcome.allowed and outcome.remaining == 0


class TestMemory:
    def test_full_buckets_are_swept(self, clock: FakeClock) -> None:
        store = limiter(clock, sweep_interval_secs=30)
        for n in range(1000):
            store.charge_now(bucket(Quota.per_minute(10), f"ip:{n}"))
        assert len(store) == 1000
        clock.advance(31)  # each bucket took one request: full again 6 s later
        store.charge_now(bucket(Quota.per_minute(10), "fresh"))
        assert len(store) == 1

    def test_bucket_count_never_exceeds_the_bound(self, clock: FakeClock) -> None:
        store = limiter(clock, max_buckets=100)
        for n in range(10_000):
            store.charge_now(bucket(Quota.per_hour(10), f"ip:{n}"))
            assert len(store) <= 100
        assert len(store) == 100

    def test_recently_refused_caller_is_not_evicted_first(self, clock: FakeClock) -> None:
        """A throttled caller that keeps knocking stays throttled while a flood of new keys arrives."""
        store, spent = limiter(clock, max_buckets=10), bucket(Quota.per_hour(1), "abuser")
        store.charge_now(spent)
        for n in range(50):
            store.charge_now(bucket(Quota.per_hour(10), f"ip:{n}"))
            assert not store.charge_now(spent).allowed

    def test_manual_sweep_reports_what_it_dropped(self, clock: FakeClock) -> None:
        store = limiter(clock)
        store.charge_now(bucket(Quota.per_second(1), "a"))
        store.charge_now(bucket(Quota.per_hour(1), "b"))
        clock.advance(2)
        assert store.sweep() == 1
        assert len(store) == 1

    def test_max_buckets_must_be_positive(self, clock: FakeClock) -> None:
        with pytest.raises(ValueError, match="max_buckets"):
            limiter(clock, max_buckets=0)


def test_gcra_pure_function() -> None:
    first = gcra(None, 100.0, interval=6.0, burst=2)
    assert (first.allowed, first.tat, first.remaining, first.reset_after) == (True, 106.0, 1, 6.0)
    second = gcra(first.tat, 100.0, interval=6.0, burst=2)
    assert (second.allowed, second.tat, second.remaining) == (True, 112.0, 0)
    third = gcra(second.tat, 100.0, interval=6.0, burst=2)
    assert (third.allowed, third.tat, third.retry_after, third.reset_after) == (False, 112.0, 6.0, 12.0)
