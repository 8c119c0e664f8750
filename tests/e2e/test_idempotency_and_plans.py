"""End to end: Idempotency-Key and rate-limit plans in two real ``bastion run`` processes sharing one Valkey."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from bastion.testing import TokenMinter
from tests.conftest import BastionProcess

EXAMPLE_DIR = Path("examples/documents_api")


@pytest.fixture(scope="module")
def pair(
    module_bastion_process: Callable[..., BastionProcess],
    key_env: dict[str, str],
    valkey_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[BastionProcess, BastionProcess]:
    """Two instances of the example API on one Valkey (distributed limiter), with a ``free`` plan of 4 requests a
    day selected by the ``plan`` claim, started side by side."""
    config = tmp_path_factory.mktemp("config") / "config.toml"
    config.write_text((EXAMPLE_DIR / "config.toml").read_text() + "\n[rate_limit.plans.free]\nper_day = 4\n")
    env = {
        **key_env,
        "SERVICE_POLICY_POLICY_PATH": str((EXAMPLE_DIR / "policies.cedar").resolve()),
        "SERVICE_CACHE_STORE_URL": valkey_url,
        "SERVICE_RATE_LIMIT_DISTRIBUTED": "true",
        "SERVICE_RATE_LIMIT_PLAN_CLAIM": "plan",
        "SERVICE_RATE_LIMIT_IETF_HEADERS": "true",
    }
    args = ("examples.documents_api:service", "--config", str(config))
    first, second = (module_bastion_process(*args, env=env, wait=False) for _ in range(2))
    first.wait_ready()
    second.wait_ready()
    return first, second


def bearer(minter: TokenMinter, sub: str, **claims: object) -> dict[str, str]:
    return {"authorization": "Bearer " + minter.mint(sub=sub, ttl=600, roles=["user"], **claims)}


def test_an_idempotent_post_is_replayed_by_the_other_instance(
    pair: tuple[BastionProcess, BastionProcess], minter: TokenMinter
) -> None:
    first, second = pair
    user = {**bearer(minter, f"ida-{uuid.uuid4().hex[:6]}"), "Idempotency-Key": uuid.uuid4().hex}
    body = {"title": "Quarterly report", "content": "Numbers"}

    created = httpx.post(first.url + "/api/v2/documents", json=body, headers=user)
    replayed = httpx.post(second.url + "/api/v2/documents", json=body, headers=user)
    reused = httpx.post(second.url + "/api/v2/documents", json={**body, "title": "Other"}, headers=user)

    assert created.status_code == 200
    assert "idempotent-replayed" not in created.headers
    assert (replayed.status_code, replayed.headers["idempotent-replayed"]) == (200, "true")
    assert replayed.json() == created.json()
    # The second instance never ran the handler: its own store has no such document.
    owner, doc_id = created.json()["owner_id"], created.json()["id"]
    assert httpx.get(f"{second.url}/api/v2/documents/{owner}/{doc_id}", headers=user).status_code == 404
    assert (reused.status_code, reused.json()["code"]) == (422, "IDEMPOTENCY_KEY_REUSED")


def test_a_plans_day_window_is_shared_by_both_instances(
    pair: tuple[BastionProcess, BastionProcess], minter: TokenMinter
) -> None:
    free = bearer(minter, f"pat-{uuid.uuid4().hex[:6]}", plan="free")
    replies = [httpx.get(process.url + "/api/v2/documents", headers=free) for process in pair * 3]
    assert [reply.status_code for reply in replies] == [200, 200, 200, 200, 429, 429]
    assert replies[3].headers["ratelimit-policy"] == '"minute";q=600;w=60, "day";q=4;w=86400'
    assert replies[4].headers["x-ratelimit-limit"] == "4"
    assert replies[4].headers["ratelimit"].startswith('"day";r=0;t=')
