"""Bucket selection: user, then client, then IP; route buckets; key shapes; the client IP behind proxies."""

from __future__ import annotations

import math

import pytest

from bastion.config import RateLimitSettings, RouteRule
from bastion.ratelimit._buckets import Outcome, RuleSet
from tests.bastion.ratelimit.conftest import make_scope


def rule_set(**overrides: object) -> RuleSet:
    return RuleSet.from_settings(RateLimitSettings.model_validate(overrides))


class TestSelection:
    def test_sub_gives_the_per_user_bucket(self) -> None:
        bucket = rule_set().bucket_for(make_scope(sub="alice", client_id="billing"))
        assert bucket.key == "rate_limit:user:alice:60"
        assert (bucket.quota.limit, bucket.quota.period_secs) == (600, 60)

    def test_client_id_without_sub_gives_the_per_client_bucket(self) -> None:
        bucket = rule_set().bucket_for(make_scope(client_id="billing"))
        assert bucket.key == "rate_limit:client:billing:60"
        assert bucket.quota.limit == 1200

    def test_no_claims_gives_the_per_ip_bucket(self) -> None:
        bucket = rule_set().bucket_for(make_scope(peer="203.0.113.9"))
        assert bucket.key == "rate_limit:ip:203.0.113.9:60"
        assert bucket.quota.limit == 300

    def test_empty_sub_falls_through_to_client(self) -> None:
        assert rule_set().bucket_for(make_scope(sub="", client_id="svc")).key == "rate_limit:client:svc:60"

    def test_window_and_limits_come_from_settings(self) -> None:
        rules = rule_set(per_user_rpm=5, window_secs=10, burst_size=2)
        bucket = rules.bucket_for(make_scope(sub="bob"))
        assert bucket.key == "rate_limit:user:bob:10"
        assert (bucket.quota.limit, bucket.quota.period_secs, bucket.quota.burst) == (5, 10, 2)

    def test_burst_defaults_to_the_per_window_limit(self) -> None:
        assert rule_set(per_ip_rpm=7).bucket_for(make_scope()).quota.burst == 7


class TestRouteBuckets:
    def test_per_user_route_bucket(self) -> None:
        rules = rule_set(routes={"POST /api/*/documents": RouteRule(requests_per_minute=5, burst_size=2)})
        bucket = rules.bucket_for(make_scope("/api/v2/documents", method="POST", sub="alice"))
        assert bucket.key == "route:POST /api/*/documents:user:alice"
        assert (bucket.quota.limit, bucket.quota.period_secs, bucket.quota.burst) == (5, 60, 2)

    def test_per_user_route_bucket_for_clients_and_anonymous_callers(self) -> None:
        rules = rule_set(routes={"/api/v1/uploads": RouteRule(requests_per_minute=5)})
        client = rules.bucket_for(make_scope("/api/v1/uploads", client_id="billing"))
        anonymous = rules.bucket_for(make_scope("/api/v1/uploads", peer="10.1.2.3"))
        assert client.key == "route:/api/v1/uploads:client:billing"
        assert anonymous.key == "route:/api/v1/uploads:ip:10.1.2.3"

    def test_shared_route_bucket_ignores_the_caller(self) -> None:
        rules = rule_set(routes={"/api/v1/export": RouteRule(requests_per_hour=3, per_user=False)})
        alice = rules.bucket_for(make_scope("/api/v1/export", sub="alice"))
        bob = rules.bucket_for(make_scope("/api/v1/export", sub="bob"))
        assert alice.key == bob.key == "route:/api/v1/export:global"

    def test_route_key_uses_the_canonical_pattern(self) -> None:
        rules = rule_set(routes={"post /api/v1/users/42/": RouteRule(requests_per_minute=1)})
        bucket = rules.bucket_for(make_scope("/api/v1/users/7", method="POST", sub="a"))
        assert bucket.key == "route:POST /api/v1/users/{id}:user:a"

    def test_unmatched_path_uses_the_global_bucket(self) -> None:
        rules = rule_set(routes={"/api/v1/uploads": RouteRule(requests_per_minute=5)})
        assert rules.bucket_for(make_scope("/api/v1/other", sub="alice")).key == "rate_limit:user:alice:60"


XFF = b"x-forwarded-for"


class TestClientIp:
    """The IP bucket's address (spec, limits / rate limiting 3), read through bastion._client_ip."""

    @staticmethod
    def ip_key(*headers: tuple[bytes, bytes], trusted: bool, peer: str | None = "10.0.0.1") -> str:
        scope = make_scope(peer=peer, headers=list(headers))
        return rule_set().bucket_for(scope, trust_forwarded=trusted).key

    def test_untrusted_spoofed_forwarded_for_is_ignored(self) -> None:
        key = self.ip_key((XFF, b"1.2.3.4"), (b"x-real-ip", b"5.6.7.8"), trusted=False)
        assert key == "rate_limit:ip:10.0.0.1:60"

    def test_trusted_first_forwarded_for_entry_wins(self) -> None:
        key = self.ip_key((XFF, b"198.51.100.7, 10.9.9.9"), (b"x-real-ip", b"5.6.7.8"), trusted=True)
        assert key == "rate_limit:ip:198.51.100.7:60"

    def test_trusted_real_ip_when_no_forwarded_for(self) -> None:
        assert self.ip_key((b"x-real-ip", b"5.6.7.8"), trusted=True) == "rate_limit:ip:5.6.7.8:60"

    def test_trusted_without_headers_uses_the_peer(self) -> None:
        assert self.ip_key(trusted=True) == "rate_limit:ip:10.0.0.1:60"

    def test_hundreds_of_entries_use_the_first(self) -> None:
        value = ", ".join(f"10.0.{n // 256}.{n % 256}" for n in range(500)).encode()
        assert self.ip_key((XFF, b"192.0.2.1, " + value), trusted=True) == "rate_limit:ip:192.0.2.1:60"

    def test_ipv6_is_normalized(self) -> None:
        key = self.ip_key((XFF, b"2001:DB8:0:0::1"), trusted=True)
        assert key == "rate_limit:ip:2001:db8::1:60"

    def test_bracketed_ipv6_with_port(self) -> None:
        assert self.ip_key((XFF, b"[2001:db8::2]:443"), trusted=True) == "rate_limit:ip:2001:db8::2:60"

    def test_ipv4_mapped_ipv6_is_the_ipv4_address(self) -> None:
        assert self.ip_key((XFF, b"::ffff:192.0.2.5"), trusted=True) == "rate_limit:ip:192.0.2.5:60"
        assert self.ip_key(trusted=False, peer="::ffff:192.0.2.6") == "rate_limit:ip:192.0.2.6:60"

    def test_ipv6_peer(self) -> None:
        assert self.ip_key(trusted=False, peer="::1") == "rate_limit:ip:::1:60"

    @pytest.mark.parametrize(
        "value",
        [
            pytest.param(b"not-an-ip", id="word"),
            pytest.param(b"999.1.1.1", id="out-of-range"),
            pytest.param(b"", id="empty"),
            pytest.param(b",,,", id="only-commas"),
            pytest.param(b"1.2.3.4" + b"5" * 200, id="oversized"),
            pytest.param(b"\xff\xfe\x00", id="binary"),
            pytest.param(b"unknown, 1.2.3.4", id="first-entry-bad"),
        ],
    )
    def test_malformed_values_fall_back_to_the_peer(self, value: bytes) -> None:
        assert self.ip_key((XFF, value), trusted=True) == "rate_limit:ip:10.0.0.1:60"

    def test_malformed_forwarded_for_then_valid_real_ip(self) -> None:
        assert self.ip_key((XFF, b"garbage"), (b"x-real-ip", b"5.6.7.8"), trusted=True) == "rate_limit:ip:5.6.7.8:60"

    def test_no_peer_at_all(self) -> None:
        assert self.ip_key(trusted=False, peer=None) == "rate_limit:ip:unknown:60"


class TestOutcomeHeaders:
    def test_allowed_headers(self) -> None:
        outcome = Outcome(allowed=True, limit=10, remaining=7, retry_after=0.0, reset_at=1_700_000_012.2)
        assert outcome.headers() == [
            ("x-ratelimit-limit", "10"),
            ("x-ratelimit-remaining", "7"),
            ("x-ratelimit-reset", "1700000013"),
        ]
        assert outcome.retry_after_secs == 0

    def test_refused_retry_after_rounds_up_and_remaining_is_zero(self) -> None:
        outcome = Outcome(allowed=False, limit=10, remaining=3, retry_after=0.2, reset_at=1_700_000_060.0)
        assert outcome.retry_after_secs == math.ceil(0.2) == 1
        assert ("x-ratelimit-remaining", "0") in outcome.headers()
