"""A limit next to the route (``rate_limit="10/minute"``) and route keys in the route template syntax."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from bastion import ConfigError, Service
from bastion.config import RouteRule
from bastion.routing._limits import parse_rate
from bastion.testing import ServiceClient

TOKEN_OFF = "[token]\nenabled = false\n"


def notes_service(rate_limit: str | None = None) -> Service:
    service = Service("notes")
    v2 = service.version(2)

    @v2.post("/notes/{note_id}", rate_limit=rate_limit)
    async def update_note(note_id: str) -> dict[str, str]:
        return {"id": note_id}

    @v2.get("/notes")
    async def list_notes() -> list[str]:
        return []

    return service


def config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "service.toml"
    path.write_text(TOKEN_OFF + extra)
    return path


def statuses(client: ServiceClient, count: int, path: str = "/api/v2/notes/n-1") -> list[int]:
    return [client.post(path).status_code for _ in range(count)]


def test_a_route_option_answers_429_with_the_rate_limit_headers_after_n_requests(tmp_path: Path) -> None:
    with ServiceClient(notes_service(rate_limit="2/minute"), config=config(tmp_path)) as client:
        assert statuses(client, 2) == [200, 200]
        refused = client.post("/api/v2/notes/n-2")  # another note: the same route, the same bucket
    assert refused.status_code == 429
    assert refused.json()["code"] == "RATE_LIMIT_EXCEEDED"
    assert refused.headers["x-ratelimit-limit"] == "2"
    assert refused.headers["x-ratelimit-remaining"] == "0"
    assert 1 <= int(refused.headers["retry-after"]) <= 30  # one request every 60 s / 2
    assert int(refused.headers["x-ratelimit-reset"]) > 0


def test_a_route_option_limits_only_its_route(tmp_path: Path) -> None:
    with ServiceClient(notes_service(rate_limit="1/minute"), config=config(tmp_path)) as client:
        assert statuses(client, 2) == [200, 429]
        assert client.get("/api/v2/notes").headers["x-ratelimit-limit"] == "300"  # the global per-IP limit


def test_an_id_placeholder_of_a_route_option_is_any_segment_as_in_the_route(tmp_path: Path) -> None:
    """In a table key ``{id}`` is a numeric or UUID segment; on a route it is what the router matches."""
    service = Service("users")

    @service.version(1).get("/users/{id}", rate_limit="1/minute")
    async def user(id: str) -> dict[str, str]:
        return {"id": id}

    with ServiceClient(service, config=config(tmp_path)) as client:
        assert [client.get("/api/v1/users/me").status_code for _ in range(2)] == [200, 429]


def test_a_template_key_in_the_table_limits_the_route(tmp_path: Path) -> None:
    table = '[rate_limit.routes."POST /api/v2/notes/{note_id}"]\nrequests_per_minute = 2\n'
    with ServiceClient(notes_service(), config=config(tmp_path, table)) as client:
        assert statuses(client, 3) == [200, 200, 429]


def test_the_table_wins_over_the_route_option_for_the_same_route(tmp_path: Path) -> None:
    table = '[rate_limit.routes."/api/v2/notes/*"]\nrequests_per_minute = 3\n'
    with capture_logs() as logs, ServiceClient(notes_service("1/minute"), config=config(tmp_path, table)) as client:
        assert statuses(client, 4) == [200, 200, 200, 429]
    replaced = [log for log in logs if log["event"] == "rate_limit_route_option_replaced"]
    assert replaced == [
        {
            "event": "rate_limit_route_option_replaced",
            "route": "POST /api/v2/notes/{note_id}",
            "key": "/api/v2/notes/*",
            "log_level": "info",
        }
    ]


@pytest.mark.parametrize("text", ["10/fortnight", "0/minute", "ten/minute", "10/5 minutes", "-1/second", ""], ids=repr)
def test_a_bad_rate_is_refused_at_registration_in_one_line(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        notes_service(rate_limit=text)
    assert str(caught.value) == (
        f"rate_limit={text!r} on v2 '/notes/{{note_id}}': expected 'N/second', 'N/minute', 'N/hour' or 'N/day' "
        "with N a positive whole number, e.g. '10/minute'"
    )


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        pytest.param("10/second", RouteRule(requests_per_second=10), id="second"),
        pytest.param("10/minute", RouteRule(requests_per_minute=10), id="minute"),
        pytest.param("10 per hour", RouteRule(requests_per_hour=10), id="per-hour"),
        pytest.param("1000/days", RouteRule(requests_per_day=1000), id="days"),
    ],
)
def test_a_rate_is_the_table_entry_it_stands_for(text: str, rule: RouteRule) -> None:
    assert parse_rate(text, route="v2 '/notes'") == rule
