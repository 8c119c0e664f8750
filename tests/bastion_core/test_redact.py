"""Redaction: passwords and query strings of URLs never reach output."""

from __future__ import annotations

import pytest

from bastion_core import mask_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        pytest.param("https://user:pw@host/x?token=t", "https://user:***@host/x?***", id="password-and-query"),
        pytest.param("redis://:pw@valkey:6379/0", "redis://:***@valkey:6379/0", id="empty-user"),
        pytest.param("https://host/hook", "https://host/hook", id="nothing-secret"),
        pytest.param("https://h/x?a=1,2&token=s3cret", "https://h/x?***", id="comma-in-query"),
        pytest.param("nats://app:pa,ss@h:4222", "nats://app:***@h:4222", id="comma-in-password"),
        pytest.param("nats://s3cret-token@h:4222", "nats://***@h:4222", id="token-only-userinfo"),
        pytest.param("not a url", "not a url", id="not-a-url"),
    ],
)
def test_one_url(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_cluster_urls_are_masked_one_by_one() -> None:
    cluster = "nats://a:one@h1:4222,tls://b:two@h2:4222,nats://h3:4222,nats://tok@h4:4222"
    assert mask_url(cluster, cluster=True) == (
        "nats://a:***@h1:4222,tls://b:***@h2:4222,nats://h3:4222,nats://***@h4:4222"
    )
