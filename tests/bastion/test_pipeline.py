"""The pipeline: one ordered list for HTTP, the same order for gRPC, layers on or off by configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion import ConfigError, Service, Slot, load_settings
from bastion._pipeline import grpc_steps
from bastion.testing import TokenMinter
from bastion.types import ASGIApp, Scope

BASE = [
    "request_id",
    "observe",
    "panic_recovery",
    "error_rendering",
    "path_normalization",
    "timeout",
    "body_limit",
    "compression",
    "deprecation",
    "route_resolution",
]


def service() -> Service:
    built = Service("pipeline")
    built.version(1).get("/x")(lambda: {})
    return built


def passthrough(app: ASGIApp) -> ASGIApp:
    return app


async def hook(scope: Scope) -> None:
    return None


@pytest.fixture
def secured_env(tmp_path: Path) -> dict[str, str]:
    key = tmp_path / "public.pem"
    key.write_bytes(TokenMinter("RS256").public_pem())
    policies = tmp_path / "p.cedar"
    policies.write_text("permit(principal, action, resource);")
    return {"SERVICE_TOKEN_PUBLIC_KEY_PATH": str(key), "SERVICE_POLICY_POLICY_PATH": str(policies)}


def names(environ: dict[str, str], built: Service | None = None) -> list[str]:
    app = (built or service()).build(load_settings(environ=environ))
    return [step.name for step in app.steps]


def test_open_service_with_defaults() -> None:
    assert names({"SERVICE_TOKEN_ENABLED": "false"}) == [*BASE, "rate_limit"]


def test_secured_service_runs_auth_then_limit_then_policy(secured_env: dict[str, str]) -> None:
    assert names(secured_env) == [*BASE, "token_auth", "rate_limit", "policy"]


def test_switched_off_layers_are_not_in_the_list(secured_env: dict[str, str]) -> None:
    environ = {
        **secured_env,
        "SERVICE_MIDDLEWARE_SECURITY_HEADERS_ENABLED": "false",
        "SERVICE_MIDDLEWARE_ACCESS_LOG_ENABLED": "false",
        "SERVICE_METRICS_ENABLED": "false",
        "SERVICE_MIDDLEWARE_COMPRESSION_ENABLED": "false",
        "SERVICE_RATE_LIMIT_ENABLED": "false",
        "SERVICE_POLICY_ENABLED": "false",
    }
    assert names(environ) == [
        "request_id",
        "panic_recovery",
        "error_rendering",
        "path_normalization",
        "timeout",
        "body_limit",
        "deprecation",
        "route_resolution",
        "token_auth",
    ]


def test_cors_is_listed_once_an_origin_is_set() -> None:
    listed = names({"SERVICE_TOKEN_ENABLED": "false", "SERVICE_MIDDLEWARE_CORS_ALLOW_ORIGINS": "https://app.example"})
    assert listed[:4] == ["request_id", "observe", "panic_recovery", "cors"]


def test_observe_stays_for_metrics_when_the_access_log_is_off() -> None:
    listed = names({"SERVICE_TOKEN_ENABLED": "false", "SERVICE_MIDDLEWARE_ACCESS_LOG_ENABLED": "false"})
    assert listed[:3] == ["request_id", "observe", "panic_recovery"]


def test_operator_layers_follow_the_built_in_layer_of_their_slot(secured_env: dict[str, str]) -> None:
    built = service()
    built.use(Slot.RESILIENCE, passthrough)
    built.use(Slot.POLICY, passthrough)
    built.use(Slot.TOKEN_AUTH, passthrough)
    built.use(Slot.TOKEN_AUTH, passthrough)
    assert names(secured_env, built)[len(BASE) :] == [
        "token_auth",
        "token_auth:operator:1",
        "token_auth:operator:2",
        "rate_limit",
        "policy",
        "policy:operator:1",
        "resilience:operator:1",
    ]


def test_resilience_layers_come_last_in_the_order_they_were_asked_for(secured_env: dict[str, str]) -> None:
    built = service()
    built.use(Slot.RESILIENCE, passthrough)
    built.use_resilience(version=1)
    built.use_resilience(paths=["/api/v1/reports/*"], name="reports")
    assert names(secured_env, built)[len(BASE) :] == [
        "token_auth",
        "rate_limit",
        "policy",
        "resilience:v1",
        "resilience:reports",
        "resilience:operator:1",
    ]


def test_grpc_takes_its_order_from_the_same_list(secured_env: dict[str, str]) -> None:
    built = service()
    built.use(Slot.POLICY, passthrough, grpc=hook)
    built.use(Slot.TOKEN_AUTH, passthrough, grpc=hook)
    built.use(Slot.RESILIENCE, passthrough)  # no gRPC hook: HTTP only
    built.use_resilience()
    app = built.build(load_settings(environ=secured_env))
    assert [step.name for step in grpc_steps(app.steps)] == [
        "token_auth",
        "token_auth:operator:1",
        "rate_limit",
        "policy",
        "policy:operator:1",
        "resilience:default",
    ]


@pytest.mark.parametrize(
    "register",
    [
        pytest.param(lambda s: s.use(Slot.POLICY, passthrough), id="use"),
        pytest.param(lambda s: s.version(2), id="version"),
        pytest.param(lambda s: s.add_readiness_check("db", hook), id="readiness-check"),
        pytest.param(lambda s: s.set_fallback_app(passthrough), id="fallback"),
        pytest.param(lambda s: s.mount_revoke_token_route(), id="revoke-route"),
    ],
)
def test_registering_after_build_raises(register: object) -> None:
    built = service()
    built.build(load_settings(environ={"SERVICE_TOKEN_ENABLED": "false"}))
    with pytest.raises(ConfigError, match=r"^service\.\w+\(\) after service\.build\(\): register everything before"):
        register(built)  # type: ignore[operator]


def test_deprecating_after_build_stays_allowed() -> None:
    built = service()
    built.version(2)
    built.build(load_settings(environ={"SERVICE_TOKEN_ENABLED": "false"}))
    built.deprecate(1, replacement=2)
    assert built.api.versions[1].deprecation is not None


def test_idempotency_runs_after_policy_and_before_resilience(secured_env: dict[str, str]) -> None:
    built = service()
    built.api.versions[1].post("/orders", idempotency=True)(lambda: {})
    built.use_resilience(version=1)
    assert names(secured_env, built)[len(BASE) :] == [
        "token_auth",
        "rate_limit",
        "policy",
        "idempotency",
        "resilience:v1",
    ]
