"""Secure by default: which layers a configuration turns on, what refuses to start, and the posture summary."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from structlog.testing import capture_logs

from bastion import ConfigError, Service, Slot, load_settings
from bastion._security import TOKEN_NOT_CONFIGURED, Security
from bastion.config import Settings
from bastion.testing import TokenMinter
from bastion.types import ASGIApp, Receive, Scope, Send

# The spec's [token] table, key for key (the JWT keys; no `enabled`, which the spec does not name).
SPEC_TOKEN_TABLE = """
[{section}]
algorithm = "RS256"
public_key_path = "{key}"
revocation_enabled = true
leeway_seconds = 30
required_audience = "documents"
required_issuer = "https://auth.example"
exclude_paths = ["/api/v1/openapi.json"]
"""


@pytest.fixture(scope="module")
def minter() -> TokenMinter:
    return TokenMinter("RS256")


@pytest.fixture
def public_key(minter: TokenMinter, tmp_path: Path) -> Path:
    path = tmp_path / "public.pem"
    path.write_bytes(minter.public_pem())
    return path


def write(tmp_path: Path, text: str, name: str = "service.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def notes_service() -> Service:
    service = Service("notes")
    v1 = service.version(1)

    @v1.get("/notes")
    async def notes() -> list[str]:
        return ["n"]

    return service


class TestPresenceTurnsLayersOn:
    @pytest.mark.parametrize("section", ["token", "jwt"])
    def test_spec_token_table_turns_token_auth_on(self, tmp_path: Path, public_key: Path, section: str) -> None:
        settings = load_settings(write(tmp_path, SPEC_TOKEN_TABLE.format(section=section, key=public_key)), environ={})
        assert settings.token.enabled is None
        assert settings.token.active is True

    @pytest.mark.parametrize(
        ("keys", "source"),
        [
            pytest.param({"SERVICE_TOKEN_PUBLIC_KEY_PATH": "/k.pem"}, "public_key_path", id="public-key"),
            pytest.param({"SERVICE_TOKEN_ALGORITHM": "HS256", "SERVICE_TOKEN_SECRET": "s" * 32}, "secret", id="secret"),
            pytest.param({"SERVICE_TOKEN_JWKS_URL": "https://idp/jwks"}, "jwks_url", id="jwks-url"),
            pytest.param({"SERVICE_TOKEN_JWKS_PATH": "/jwks.json"}, "jwks_path", id="jwks-path"),
            pytest.param({"SERVICE_TOKEN_FORMAT": "paseto", "SERVICE_TOKEN_KEY_PATH": "/k"}, "key_path", id="paseto"),
        ],
    )
    def test_each_key_source_turns_token_auth_on(self, keys: dict[str, str], source: str) -> None:
        token = load_settings(environ=keys).token
        assert (token.active, token.key_sources) == (True, [source])

    def test_explicit_false_turns_token_auth_off(self, public_key: Path) -> None:
        token = load_settings(
            environ={"SERVICE_TOKEN_PUBLIC_KEY_PATH": str(public_key), "SERVICE_TOKEN_ENABLED": "false"}
        ).token
        assert token.active is False

    def test_enabled_true_stays_accepted(self, public_key: Path) -> None:
        token = load_settings(
            environ={"SERVICE_TOKEN_PUBLIC_KEY_PATH": str(public_key), "SERVICE_TOKEN_ENABLED": "true"}
        ).token
        assert token.active is True

    @pytest.mark.parametrize("spelling", ["policy_path", "policies_path"])
    def test_policy_path_turns_policy_on(self, tmp_path: Path, spelling: str) -> None:
        settings = load_settings(write(tmp_path, f'[policy]\n{spelling} = "p.cedar"\n'), environ={})
        assert settings.policy.active is True

    def test_policy_explicit_false_turns_it_off(self, tmp_path: Path) -> None:
        settings = load_settings(write(tmp_path, '[policy]\npolicy_path = "p.cedar"\nenabled = false\n'), environ={})
        assert settings.policy.active is False

    def test_broker_url_turns_the_broker_on(self) -> None:
        settings = load_settings(environ={"SERVICE_BROKER_URL": "nats://127.0.0.1:4222"})
        assert settings.broker is not None and settings.broker.active is True

    def test_broker_explicit_false_turns_it_off(self, tmp_path: Path) -> None:
        path = write(tmp_path, '[broker]\nurl = "nats://127.0.0.1:4222"\nenabled = false\n')
        broker = load_settings(path, environ={}).broker
        assert broker is not None and broker.active is False


class TestRefusals:
    def test_no_token_key_refuses_with_the_fix(self) -> None:
        with pytest.raises(ConfigError) as info:
            notes_service().build(load_settings(environ={}))
        assert str(info.value) == TOKEN_NOT_CONFIGURED
        assert str(info.value) == (
            "token authentication has no key: set token.public_key_path, token.secret, token.key_path or "
            "token.jwks_url, or token.enabled = false to serve every business route without a token"
        )

    def test_token_section_without_a_key_refuses(self, tmp_path: Path) -> None:
        settings = load_settings(write(tmp_path, '[token]\nalgorithm = "RS256"\nleeway_seconds = 30\n'), environ={})
        with pytest.raises(ConfigError, match=r"^token authentication has no key"):
            notes_service().build(settings)

    @pytest.mark.parametrize("value", ['"yes"', '"true"', "1", '"false"'])
    def test_enabled_must_be_a_real_boolean(self, tmp_path: Path, value: str) -> None:
        with pytest.raises(ConfigError) as info:
            load_settings(write(tmp_path, f"[token]\nenabled = {value}\n"), environ={})
        assert f"token.enabled = {value.replace(chr(34), chr(39))}: expected true or false" in str(info.value)

    def test_env_enabled_takes_true_false_1_0_only(self) -> None:
        assert load_settings(environ={"SERVICE_TOKEN_ENABLED": "0"}).token.enabled is False
        assert load_settings(environ={"SERVICE_TOKEN_ENABLED": "FALSE"}).token.enabled is False
        with pytest.raises(
            ConfigError, match=r"SERVICE_TOKEN_ENABLED='yes' \(token\.enabled\): expected true or false"
        ):
            load_settings(environ={"SERVICE_TOKEN_ENABLED": "yes"})

    def test_paseto_keys_with_format_jwt_are_refused(self, tmp_path: Path) -> None:
        path = write(tmp_path, '[token]\nkey_path = "k"\npurpose = "local"\n')
        with pytest.raises(ConfigError, match=r"token\.key_path, token\.purpose set but token\.format is 'jwt'"):
            load_settings(path, environ={})

    def test_jwt_keys_with_format_paseto_are_refused(self, tmp_path: Path) -> None:
        path = write(tmp_path, '[token]\nformat = "paseto"\nkey_path = "k"\npublic_key_path = "p.pem"\n')
        with pytest.raises(ConfigError, match=r"token\.public_key_path set but token\.format is 'paseto'"):
            load_settings(path, environ={})

    def test_secret_and_public_key_together_are_refused(self, tmp_path: Path) -> None:
        path = write(tmp_path, '[token]\nsecret = "s"\npublic_key_path = "p.pem"\n')
        with pytest.raises(
            ConfigError, match=r"token\.public_key_path and token\.secret are both set; a RS256 key comes from one"
        ):
            load_settings(path, environ={})

    def test_private_key_file_is_refused(self, tmp_path: Path, minter: TokenMinter) -> None:
        key = tmp_path / "private.pem"
        key.write_bytes(minter.private_pem())
        settings = load_settings(environ={"SERVICE_TOKEN_PUBLIC_KEY_PATH": str(key)})
        with pytest.raises(ConfigError, match="a private key was given; the service needs only the public key"):
            Security.from_settings(settings, realm="x")

    def test_unreadable_key_file_names_the_key(self, tmp_path: Path) -> None:
        key = tmp_path / "locked.pem"
        key.mkdir()  # a directory: unreadable as a file, whoever runs the test
        settings = load_settings(environ={"SERVICE_TOKEN_PUBLIC_KEY_PATH": str(key)})
        with pytest.raises(ConfigError) as info:
            Security.from_settings(settings, realm="x")
        assert (
            str(info.value)
            == f"token.public_key_path = {str(key)!r}: cannot read the file (is a directory, not a file)"
        )

    def test_missing_policy_file_names_the_key(self, tmp_path: Path) -> None:
        absent = tmp_path / "absent.cedar"
        settings = load_settings(environ={"SERVICE_TOKEN_ENABLED": "false", "SERVICE_POLICY_POLICY_PATH": str(absent)})
        with pytest.raises(ConfigError) as info:
            Security.from_settings(settings, realm="x")
        assert str(info.value) == f"policy.policy_path = {str(absent)!r}: cannot read the file (no such file)"


class TestRelativePaths:
    def test_relative_paths_resolve_against_the_config_file(
        self, tmp_path: Path, minter: TokenMinter, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        config_dir = tmp_path / "conf"
        (config_dir / "keys").mkdir(parents=True)
        (config_dir / "keys" / "public.pem").write_bytes(minter.public_pem())
        (config_dir / "p.cedar").write_text("permit(principal, action, resource);")
        path = write(config_dir, '[token]\npublic_key_path = "keys/public.pem"\n[policy]\npolicy_path = "p.cedar"\n')
        monkeypatch.chdir(tmp_path)  # anywhere but the config's directory
        settings = load_settings(path, environ={})
        assert settings.token.public_key_path == str(config_dir / "keys" / "public.pem")
        assert settings.policy.policy_path == str(config_dir / "p.cedar")
        assert Security.from_settings(settings, realm="x").token_auth is not None

    def test_absolute_paths_are_kept(self, tmp_path: Path) -> None:
        settings = load_settings(write(tmp_path, '[token]\npublic_key_path = "/etc/keys/public.pem"\n'), environ={})
        assert settings.token.public_key_path == "/etc/keys/public.pem"

    def test_env_paths_stay_relative_to_the_working_directory(self) -> None:
        assert load_settings(environ={"SERVICE_TOKEN_PUBLIC_KEY_PATH": "k.pem"}).token.public_key_path == "k.pem"


class TestRemovedAndUnappliedKeys:
    def test_retry_keys_are_ignored_with_one_warning_each(self, tmp_path: Path) -> None:
        path = write(
            tmp_path,
            "[middleware.resilience]\nretry_max_attempts = 3\nretry_initial_delay_ms = 100\n"
            "circuit_breaker_threshold = 0.5\n",
        )
        with capture_logs() as logs:
            settings = load_settings(path, environ={})
        assert settings.middleware.resilience.circuit_breaker_threshold == 0.5
        ignored = [entry["key"] for entry in logs if entry["event"] == "config_key_ignored"]
        assert ignored == ["middleware.resilience.retry_initial_delay_ms", "middleware.resilience.retry_max_attempts"]

    def test_other_unknown_resilience_keys_stay_errors(self, tmp_path: Path) -> None:
        path = write(tmp_path, "[middleware.resilience]\ncircuit_breaker_treshold = 0.5\n")
        with pytest.raises(ConfigError, match=r"unknown key 'middleware\.resilience\.circuit_breaker_treshold'"):
            load_settings(path, environ={})

    def test_resilience_settings_no_layer_uses_are_reported(self, tmp_path: Path) -> None:
        path = write(
            tmp_path,
            "[token]\nenabled = false\n[middleware.resilience]\ncircuit_breaker_threshold = 0.2\n"
            "bulkhead_max_concurrent = 4\n",
        )
        posture = notes_service().build(load_settings(path, environ={})).posture()
        assert posture.not_applied == [
            (
                "middleware.resilience.bulkhead_max_concurrent",
                "no resilience layer with a bulkhead uses it: add one with service.use_resilience()",
            ),
            (
                "middleware.resilience.circuit_breaker_threshold",
                "no resilience layer with a circuit breaker uses it: add one with service.use_resilience()",
            ),
        ]
        with capture_logs() as logs:
            posture.log()
        assert [e["key"] for e in logs if e["event"] == "config_not_applied"] == [
            "middleware.resilience.bulkhead_max_concurrent",
            "middleware.resilience.circuit_breaker_threshold",
        ]

    def test_resilience_settings_a_layer_uses_are_not_reported(self, tmp_path: Path) -> None:
        path = write(tmp_path, "[token]\nenabled = false\n[middleware.resilience]\ncircuit_breaker_threshold = 0.2\n")
        service = notes_service()
        service.use_resilience(bulkhead=False)
        posture = service.build(load_settings(path, environ={})).posture()
        assert posture.not_applied == []
        assert [layer.fields() for layer in posture.resilience] == [
            {"name": "default", "breaker": True, "bulkhead": False}
        ]

    def test_posture_names_the_broker_with_its_password_masked(self) -> None:
        settings = load_settings(
            environ={"SERVICE_TOKEN_ENABLED": "false", "SERVICE_BROKER_URL": "nats://app:s3cret@h:4222,nats://h2:4222"}
        )
        posture = Security.from_settings(settings, realm="x").posture()
        assert posture.broker.fields() == {
            "enabled": True,
            "url": "nats://app:***@h:4222,nats://h2:4222",
            "optional": False,
            "lazy_init": True,
        }
        assert "broker: nats://app:***@h:4222,nats://h2:4222 (required for /ready)" in posture.lines()
        assert posture.not_applied == []


class TestPosture:
    def test_posture_names_every_layer(self, tmp_path: Path, public_key: Path) -> None:
        policies = tmp_path / "p.cedar"
        policies.write_text("permit(principal, action, resource);\nforbid(principal, action, resource) when { false };")
        settings = load_settings(
            environ={
                "SERVICE_TOKEN_PUBLIC_KEY_PATH": str(public_key),
                "SERVICE_TOKEN_REVOCATION_ENABLED": "true",
                "SERVICE_TOKEN_EXCLUDE_PATHS": "/api/v1/openapi.json",
                "SERVICE_POLICY_POLICY_PATH": str(policies),
                "SERVICE_GRPC_ENABLED": "true",
            }
        )
        posture = Security.from_settings(settings, realm="x").posture()
        assert posture.fields() == {
            "token": {
                "enabled": True,
                "format": "jwt",
                "algorithm": "RS256",
                "key": "token.public_key_path",
                "public_paths": ["/api/v1/openapi.json"],
            },
            "policy": {
                "enabled": True,
                "file": str(policies),
                "statements": 2,
                "fail_open": False,
                "hot_reload": False,
            },
            "rate_limit": {
                "mode": "local",
                "per_user_rpm": 600,
                "per_client_rpm": 1200,
                "per_ip_rpm": 300,
                "route_rules": 0,
            },
            "revocation": "memory",
            "broker": {"enabled": False},
            "grpc": "same_port",
            "metrics": "public /metrics",
            "api_docs": "public",
            "tls": False,
        }
        assert posture.lines()[:2] == [
            "token: jwt RS256, key from token.public_key_path; every route needs a token except /health, /ready, "
            "/api/v1/openapi.json",
            f"policy: {policies}, 2 statements, fail_open = false, hot reload off",
        ]

    @pytest.mark.parametrize(
        ("environ", "expected"),
        [
            ({}, "public /metrics"),
            ({"SERVICE_METRICS_PUBLIC": "false"}, "token /metrics"),
            ({"SERVICE_METRICS_PORT": "9464", "SERVICE_METRICS_PATH": "/m"}, "port 9464 /m"),
            ({"SERVICE_METRICS_ENABLED": "false"}, "off"),
        ],
    )
    def test_posture_says_where_metrics_are(self, environ: dict[str, str], expected: str) -> None:
        settings = load_settings(environ={"SERVICE_TOKEN_ENABLED": "false", **environ})
        posture = Security.from_settings(settings, realm="x").posture()
        assert posture.metrics == expected
        assert f"metrics: {expected}" in posture.lines()

    def test_posture_says_when_token_auth_is_off(self) -> None:
        posture = Security.from_settings(load_settings(environ={"SERVICE_TOKEN_ENABLED": "false"}), realm="x").posture()
        assert posture.token.fields() == {"enabled": False}
        assert posture.lines()[0] == "token: OFF (token.enabled = false): business routes need no token"

    async def test_start_up_logs_the_posture_once(self, public_key: Path) -> None:
        app = notes_service().build(load_settings(environ={"SERVICE_TOKEN_PUBLIC_KEY_PATH": str(public_key)}))
        messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
        sent: list[str] = []

        async def receive() -> dict[str, str]:
            return next(messages)

        async def send(message: dict[str, str]) -> None:
            sent.append(message["type"])

        with capture_logs() as logs:
            await app({"type": "lifespan"}, receive, send)  # type: ignore[arg-type]
        postures = [entry for entry in logs if entry["event"] == "security_posture"]
        assert len(postures) == 1
        assert postures[0]["token"]["algorithm"] == "RS256"
        assert postures[0]["policy"] == {"enabled": False}
        assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


class TestPolicyWithoutClaims:
    """Policy never steps aside: a request without claims is decided as ``Anonymous::"anonymous"``."""

    POLICIES = (
        '@id("readers")\npermit(principal is User, action == Action::"GET /api/v1/notes", resource)\n'
        'when { principal.roles.contains("reader") };\n'
        '@id("public-openapi")\npermit(principal is Anonymous, action == Action::"GET /api/v1/openapi.json", resource);'
    )

    def settings(self, tmp_path: Path, **environ: str) -> Settings:
        policies = tmp_path / "p.cedar"
        policies.write_text(self.POLICIES)
        return load_settings(environ={"SERVICE_POLICY_POLICY_PATH": str(policies), **environ})

    async def test_anonymous_request_is_denied_by_default_deny(
        self, tmp_path: Path, asgi_client: Callable[..., httpx.AsyncClient]
    ) -> None:
        client = asgi_client(notes_service(), self.settings(tmp_path, SERVICE_TOKEN_ENABLED="false"))
        response = await client.get("/api/v1/notes")
        assert response.status_code == 403
        assert response.json() == {"error": "Access denied by policy", "code": "FORBIDDEN", "status": 403}

    async def test_anonymous_principal_can_be_permitted_explicitly(
        self, tmp_path: Path, asgi_client: Callable[..., httpx.AsyncClient]
    ) -> None:
        client = asgi_client(notes_service(), self.settings(tmp_path, SERVICE_TOKEN_ENABLED="false"))
        assert (await client.get("/api/v1/openapi.json")).status_code == 200

    async def test_public_path_is_still_decided(
        self, tmp_path: Path, public_key: Path, asgi_client: Callable[..., httpx.AsyncClient]
    ) -> None:
        settings = self.settings(
            tmp_path, SERVICE_TOKEN_PUBLIC_KEY_PATH=str(public_key), SERVICE_TOKEN_EXCLUDE_PATHS="/api/v1/notes"
        )
        client = asgi_client(notes_service(), settings)
        assert (await client.get("/api/v1/notes")).status_code == 403  # public for tokens, not for the policy

    async def test_health_and_ready_need_nothing(
        self, tmp_path: Path, asgi_client: Callable[..., httpx.AsyncClient]
    ) -> None:
        client = asgi_client(notes_service(), self.settings(tmp_path, SERVICE_TOKEN_ENABLED="false"))
        assert [(await client.get(path)).status_code for path in ("/health", "/ready")] == [200, 200]

    async def test_fail_open_never_opens_for_an_anonymous_caller(
        self, tmp_path: Path, asgi_client: Callable[..., httpx.AsyncClient]
    ) -> None:
        policies = tmp_path / "erroring.cedar"
        # Valid against the schema, an error at run time: the product overflows a Cedar Long.
        policies.write_text("permit(principal, action, resource) when { context.timestamp * 10000000000 > 0 };")
        settings = load_settings(
            environ={
                "SERVICE_TOKEN_ENABLED": "false",
                "SERVICE_POLICY_POLICY_PATH": str(policies),
                "SERVICE_POLICY_FAIL_OPEN": "true",
            }
        )
        response = await asgi_client(notes_service(), settings).get("/api/v1/notes")
        assert (response.status_code, response.json()["code"]) == (500, "POLICY_ERROR")


class TestGrpcRule:
    class Servable:
        """Stands in for a generated grpclib servable: build() only counts registered services."""

        def __mapping__(self) -> dict[str, object]:
            return {}

    @staticmethod
    def layer(app: ASGIApp) -> ASGIApp:
        async def passthrough(scope: Scope, receive: Receive, send: Send) -> None:
            await app(scope, receive, send)

        return passthrough

    @pytest.mark.parametrize("slot", [Slot.TOKEN_AUTH, Slot.RATE_LIMIT, Slot.POLICY])
    def test_http_only_security_layer_with_grpc_is_refused(self, slot: Slot) -> None:
        service = notes_service()
        service.add_grpc_service(self.Servable())
        service.use(slot, self.layer)
        settings = load_settings(environ={"SERVICE_TOKEN_ENABLED": "false", "SERVICE_GRPC_ENABLED": "true"})
        with pytest.raises(ConfigError) as info:
            service.build(settings)
        assert str(info.value) == (
            f"service.use(Slot.{slot.name}, layer) guards HTTP only and gRPC is enabled: pass "
            f"service.use(Slot.{slot.name}, layer, grpc=hook) with an async hook(scope) that checks every gRPC call "
            "the same way, or set grpc.enabled = false"
        )

    def test_layer_with_a_grpc_hook_is_accepted(self) -> None:
        async def hook(scope: Scope) -> None:
            return None

        service = notes_service()
        service.add_grpc_service(self.Servable())
        service.use(Slot.TOKEN_AUTH, self.layer, grpc=hook)
        settings = load_settings(environ={"SERVICE_TOKEN_ENABLED": "false", "SERVICE_GRPC_ENABLED": "true"})
        assert service.build(settings).posture().custom_layers == {"token_auth": 1}

    def test_without_grpc_an_http_only_layer_is_fine(self) -> None:
        service = notes_service()
        service.use(Slot.TOKEN_AUTH, self.layer)
        service.build(load_settings(environ={"SERVICE_TOKEN_ENABLED": "false"}))
