"""Plans chosen by a claim, several windows per bucket, on_store_error per rule and the IETF RateLimit fields."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import MappingProxyType, SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from bastion import ConfigError, Service
from bastion._cache_store import MemoryCacheStore, RedisCacheStore
from bastion.config import RateLimitSettings
from bastion.errors import CacheStoreError, RateLimitExceeded
from bastion.ratelimit import Bucket, Quota
from bastion.ratelimit._buckets import RuleSet
from bastion.ratelimit._capability import charge
from bastion.ratelimit._distributed import DistributedLimiter
from bastion.ratelimit._local import LocalLimiter
from bastion.ratelimit._posture import RateLimitPosture
from bastion.testing import FakeClock, ServiceClient
from bastion.types import SCOPE_CLAIMS
from tests.bastion.ratelimit.conftest import make_scope

PLANS: dict[str, Any] = {
    "plan_claim": "plan",
    "plans": {"pro": {"per_user_rpm": 6000, "per_second": 10, "per_day": 100_000}, "free": {"per_day": 3}},
}


def scope_with(plan: object = None, *, sub: str = "alice", **claims: Any) -> dict[str, Any]:
    scope = make_scope(sub=sub)
    extra = {"plan": plan} if plan is not None else {}
    scope[SCOPE_CLAIMS] = SimpleNamespace(sub=sub, client_id=None, extra=MappingProxyType({**extra, **claims}))
    return scope


def windows(bucket: Bucket) -> list[tuple[str, int, float]]:
    return [(key, quota.limit, quota.period_secs) for key, quota in bucket.windows()]


class TestPlanSelection:
    def test_a_plan_claim_gives_the_plans_windows_in_one_bucket(self) -> None:
        rules = RuleSet.from_settings(RateLimitSettings.model_validate(PLANS))
        assert windows(rules.bucket_for(scope_with("pro"))) == [
            ("rate_limit:user:alice:60", 6000, 60.0),
            ("rate_limit:user:alice:1", 10, 1.0),
            ("rate_limit:user:alice:86400", 100_000, 86_400.0),
        ]

    def test_a_plan_without_a_minute_rate_keeps_the_default_one(self) -> None:
        rules = RuleSet.from_settings(RateLimitSettings.model_validate(PLANS))
        assert windows(rules.bucket_for(scope_with("free")))[0] == ("rate_limit:user:alice:60", 600, 60.0)

    def test_an_unknown_plan_falls_back_to_the_default_limits_and_is_counted(self) -> None:
        unknown: list[None] = []
        rules = RuleSet.from_settings(
            RateLimitSettings.model_validate(PLANS), unknown_plan=lambda: unknown.append(None)
        )
        assert windows(rules.bucket_for(scope_with("platinum"))) == [("rate_limit:user:alice:60", 600, 60.0)]
        assert windows(rules.bucket_for(scope_with(["pro"]))) == [("rate_limit:user:alice:60", 600, 60.0)]
        assert len(unknown) == 2

    def test_no_plan_claim_is_the_default_limits_and_not_counted(self) -> None:
        unknown: list[None] = []
        rules = RuleSet.from_settings(
            RateLimitSettings.model_validate(PLANS), unknown_plan=lambda: unknown.append(None)
        )
        assert windows(rules.bucket_for(scope_with())) == [("rate_limit:user:alice:60", 600, 60.0)]
        assert unknown == []

    def test_plans_without_a_claim_are_refused(self) -> None:
        with pytest.raises(ValidationError, match=r"rate_limit\.plan_claim is not"):
            RateLimitSettings.model_validate({"plans": {"pro": {"per_day": 1}}})

    def test_a_plan_window_equal_to_window_secs_is_refused(self) -> None:
        settings = RateLimitSettings.model_validate({**PLANS, "window_secs": 86_400})
        with pytest.raises(ConfigError, match=r"rate_limit\.plans\.pro: a 86400-second window"):
            RuleSet.from_settings(settings)


class TestTwoWindows:
    def test_the_longer_window_refuses_once_spent(self, clock: FakeClock) -> None:
        limiter = LocalLimiter(clock=clock, wall_clock=clock)
        bucket = Bucket("minute", Quota.per_minute(100), (("day", Quota(limit=3, period_secs=86_400)),))
        outcomes = [limiter.charge_now(bucket) for _ in range(4)]
        assert [o.allowed for o in outcomes] == [True, True, True, False]
        assert (outcomes[3].limit, outcomes[3].period_secs) == (3, 86_400.0)
        assert outcomes[3].retry_after == pytest.approx(86_400 / 3)

    def test_a_refused_request_counts_in_no_window(self, clock: FakeClock) -> None:
        limiter = LocalLimiter(clock=clock, wall_clock=clock)
        minute = Bucket("minute", Quota.per_minute(5))
        both = Bucket("minute", Quota.per_minute(5), (("day", Quota(limit=1, period_secs=86_400)),))
        assert limiter.charge_now(both).allowed
        assert not limiter.charge_now(both).allowed
        assert limiter.charge_now(minute).remaining == 3  # 2 charged in the minute window, not 3

    def test_an_allowed_request_reports_the_window_with_the_fewest_left(self, clock: FakeClock) -> None:
        limiter = LocalLimiter(clock=clock, wall_clock=clock)
        bucket = Bucket("minute", Quota.per_minute(100), (("day", Quota(limit=3, period_secs=86_400)),))
        outcome = limiter.charge_now(bucket)
        assert (outcome.limit, outcome.remaining) == (3, 2)


class TestOnValkey:
    @pytest.fixture
    async def store(self, valkey_url: str) -> AsyncIterator[RedisCacheStore]:
        redis_store = RedisCacheStore(valkey_url)
        yield redis_store
        await redis_store.close()

    async def test_two_windows_are_one_round_trip(self, store: RedisCacheStore) -> None:
        limiter = DistributedLimiter(store)
        who = uuid.uuid4().hex[:8]
        day = (f"rate_limit:user:{who}:86400", Quota(limit=3, period_secs=86_400))
        bucket = Bucket(f"rate_limit:user:{who}:60", Quota.per_minute(100), (day,))
        await limiter.charge(bucket)  # the first call may load the script
        await store.client.config_resetstat()
        outcomes = [await limiter.charge(bucket) for _ in range(3)]
        stats = await store.client.info("commandstats")
        assert [o.allowed for o in outcomes] == [True, True, False]
        assert stats["cmdstat_evalsha"]["calls"] == 3
        assert (outcomes[2].limit, outcomes[2].remaining) == (3, 0)
        assert await store.client.pttl(day[0]) > 0

    async def test_the_memory_store_charges_windows_alike(self) -> None:
        limiter = DistributedLimiter(MemoryCacheStore())
        bucket = Bucket("m", Quota.per_minute(100), (("d", Quota(limit=2, period_secs=86_400)),))
        assert [(await limiter.charge(bucket)).allowed for _ in range(3)] == [True, True, False]


class _DownStore(MemoryCacheStore):
    async def get(self, key: str) -> bytes | None:
        raise CacheStoreError()


class TestOnStoreError:
    async def test_fail_closed_is_the_default(self) -> None:
        rules = RuleSet.from_settings(RateLimitSettings())
        with pytest.raises(CacheStoreError):
            await charge(
                make_scope(sub="alice"),
                store=DistributedLimiter(_DownStore()),
                rules=rules,
                trust_forwarded=False,
                auditor=None,
                fallback=LocalLimiter(),
            )

    async def test_local_counts_in_this_process_while_the_store_is_down(self) -> None:
        rules = RuleSet.from_settings(RateLimitSettings(per_user_rpm=2, on_store_error="local"))
        store, fallback = DistributedLimiter(_DownStore()), LocalLimiter()

        async def once() -> bool:
            try:
                await charge(
                    make_scope(sub="alice"),
                    store=store,
                    rules=rules,
                    trust_forwarded=False,
                    auditor=None,
                    fallback=fallback,
                )
            except RateLimitExceeded:
                return False
            return True

        assert [await once() for _ in range(3)] == [True, True, False]

    def test_a_route_rule_sets_its_own(self) -> None:
        settings = RateLimitSettings.model_validate(
            {"routes": {"POST /api/v1/uploads": {"requests_per_minute": 5, "on_store_error": "local"}}}
        )
        rules = RuleSet.from_settings(settings)
        assert rules.bucket_for(make_scope("/api/v1/uploads", method="POST", sub="a")).local_fallback
        assert not rules.bucket_for(make_scope("/api/v1/items", sub="a")).local_fallback


def plan_service() -> Service:
    service = Service("plans")

    @service.version(1).get("/items")
    async def items() -> list[str]:
        return []

    return service


def test_ietf_fields_name_every_window_and_the_tightest_one(tmp_path: Path) -> None:
    config = tmp_path / "service.toml"
    config.write_text('[rate_limit]\nplan_claim = "plan"\nietf_headers = true\n[rate_limit.plans.free]\nper_day = 2\n')
    with ServiceClient(plan_service(), config=config) as client:
        free = client.as_user("alice", plan="free")
        first, _, refused = (free.get("/api/v1/items") for _ in range(3))
        default = client.as_user("bob").get("/api/v1/items")
    assert default.headers["ratelimit-policy"] == '"minute";q=600;w=60'
    assert default.headers["ratelimit"].startswith('"minute";r=599;t=')
    assert first.headers["ratelimit-policy"] == '"minute";q=600;w=60, "day";q=2;w=86400'
    assert first.headers["ratelimit"].startswith('"day";r=1;t=')
    assert first.headers["x-ratelimit-limit"] == "2"
    assert refused.status_code == 429
    assert refused.headers["ratelimit"] == f'"day";r=0;t={refused.headers["retry-after"]}'


def test_without_ietf_headers_only_the_x_fields_are_sent(tmp_path: Path) -> None:
    config = tmp_path / "service.toml"
    config.write_text("")
    with ServiceClient(plan_service(), config=config) as client:
        reply = client.as_user("alice").get("/api/v1/items")
    assert "ratelimit-policy" not in reply.headers
    assert reply.headers["x-ratelimit-limit"] == "600"


def test_an_unknown_plan_is_counted_in_metrics(tmp_path: Path) -> None:
    config = tmp_path / "service.toml"
    config.write_text('[rate_limit]\nplan_claim = "plan"\n[rate_limit.plans.pro]\nper_day = 5\n')
    with ServiceClient(plan_service(), config=config) as client:
        reply = client.as_user("alice", plan="gold").get("/api/v1/items")
        text = client.get("/metrics").text
    assert reply.headers["x-ratelimit-limit"] == "600"
    assert 'bastion_rate_limit_events_total{event="unknown_plan"} 1.0' in text


def test_the_posture_names_the_plans() -> None:
    posture = RateLimitPosture.of(RateLimitSettings.model_validate(PLANS), built_in=True)
    assert posture.line().endswith("0 route rules, plans free, pro")
    assert posture.fields()["plans"] == ["free", "pro"]
