"""Settings: TOML file, SERVICE_* overrides, defaults of the spec's tables, errors that name key and value."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from bastion.config import load_settings, masked
from bastion.config._sections import DEFAULT_CACHE_TTL_SECS
from bastion.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


class TestDefaults:
    def test_embedded_defaults_listen_on_8080_under_api(self) -> None:
        settings = load_settings(environ={})
        assert settings.service.port == 8080
        assert settings.service.base_path == "/api"

    def test_spec_defaults(self) -> None:
        settings = load_settings(environ={})
        assert settings.policy.hot_reload is False
        assert settings.policy.cache_ttl_secs == DEFAULT_CACHE_TTL_SECS == 300
        assert settings.policy.fail_open is False
        assert settings.rate_limit.auto_apply is True
        assert settings.rate_limit.trust_forwarded_headers is False
        resilience = settings.middleware.resilience
        assert resilience.circuit_breaker_threshold == 0.5
        assert resilience.circuit_breaker_min_requests == 10
        assert resilience.circuit_breaker_wait_secs == 30
        assert resilience.bulkhead_max_concurrent == 100
        assert resilience.bulkhead_max_wait == 5.0
        assert settings.audit.audit_auth_events is True
        assert settings.grpc.port == 9090
        assert settings.broker is None

    def test_json_depth_default_is_64(self) -> None:
        assert load_settings(environ={}).middleware.max_json_depth == 64

    def test_every_spec_key_exists(self) -> None:
        settings = load_settings(environ={})
        spec_keys = {
            "token": "secret public_key_path algorithm revocation_enabled leeway_seconds required_audience "
            "required_issuer exclude_paths include_paths format version purpose key_path public_paths",
            "policy": "enabled policy_path hot_reload hot_reload_interval_secs cache_enabled cache_ttl_secs fail_open",
            "cache_store": "url max_connections",
            "rate_limit": "per_user_rpm per_client_rpm window_secs auto_apply trust_forwarded_headers routes",
        }
        for section, keys in spec_keys.items():
            fields = type(getattr(settings, section)).model_fields
            assert set(keys.split()) <= set(fields), section
        resilience = type(settings.middleware.resilience).model_fields
        assert {
            "circuit_breaker_enabled",
            "circuit_breaker_threshold",
            "circuit_breaker_min_requests",
            "circuit_breaker_wait_secs",
            "bulkhead_max_concurrent",
            "bulkhead_max_wait",
        } <= set(resilience)

    def test_broker_section_keys_and_defaults(self, tmp_path: Path) -> None:
        settings = load_settings(write(tmp_path, '[broker]\nurl = "nats://127.0.0.1:4222"\n'), environ={})
        assert settings.broker is not None
        assert settings.broker.optional is False
        assert settings.broker.lazy_init is True
        assert {"name", "max_reconnects", "max_retries", "retry_delay_secs"} <= set(type(settings.broker).model_fields)


class TestFile:
    def test_file_values_are_read(self, tmp_path: Path) -> None:
        path = write(tmp_path, '[service]\nname = "docs"\nport = 9001\n[rate_limit]\nper_user_rpm = 42\n')
        settings = load_settings(path, environ={})
        assert (settings.service.name, settings.service.port, settings.rate_limit.per_user_rpm) == (
            "docs",
            9001,
            42,
        )

    def test_jwt_section_is_an_alias_of_token(self, tmp_path: Path) -> None:
        settings = load_settings(write(tmp_path, '[jwt]\nalgorithm = "ES256"\nleeway_seconds = 5\n'), environ={})
        assert settings.token.algorithm == "ES256"
        assert settings.token.leeway_seconds == 5

    def test_key_in_both_jwt_and_token_is_an_error(self, tmp_path: Path) -> None:
        path = write(tmp_path, '[jwt]\nalgorithm = "ES256"\n[token]\nalgorithm = "RS256"\n')
        with pytest.raises(ConfigError, match=r"algorithm set in both \[jwt\] and \[token\]"):
            load_settings(path, environ={})

    def test_policies_path_spelling_is_accepted(self, tmp_path: Path) -> None:
        settings = load_settings(write(tmp_path, '[policy]\npolicies_path = "p.cedar"\n'), environ={})
        assert settings.policy.policy_path == str(tmp_path / "p.cedar")

    def test_route_rules_parse(self, tmp_path: Path) -> None:
        text = '[rate_limit.routes."POST /api/v1/uploads"]\nrequests_per_minute = 10\nburst_size = 2\n'
        rule = load_settings(write(tmp_path, text), environ={}).rate_limit.routes["POST /api/v1/uploads"]
        assert (rule.requests_per_minute, rule.burst_size, rule.per_user) == (10, 2, True)

    def test_missing_file_names_the_path(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match=r"config file not found: .*nope\.toml"):
            load_settings(tmp_path / "nope.toml", environ={})

    def test_toml_syntax_error_names_file_and_line(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match=r"config.toml is not valid TOML: .*line 2"):
            load_settings(write(tmp_path, "[service]\nport = = 1\n"), environ={})

    def test_unknown_key_is_named(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match=r"unknown key 'service.prot'"):
            load_settings(write(tmp_path, "[service]\nprot = 1\n"), environ={})

    def test_unknown_section_is_named(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match=r"unknown key 'databse'"):
            load_settings(write(tmp_path, "[databse]\nurl = 1\n"), environ={})

    @pytest.mark.parametrize(
        ("text", "fragment"),
        [
            pytest.param('[service]\nport = "eighty"\n', "service.port = 'eighty'", id="port-type"),
            pytest.param("[service]\nport = 70000\n", "service.port = 70000", id="port-range"),
            pytest.param('[token]\nalgorithm = "none"\n', "token.algorithm = 'none'", id="alg-none"),
            pytest.param("[rate_limit]\nper_user_rpm = -1\n", "rate_limit.per_user_rpm = -1", id="negative-rpm"),
            pytest.param('[service]\nbase_path = "api"\n', "service.base_path = 'api'", id="relative-base-path"),
            pytest.param(
                '[middleware.resilience]\nbulkhead_max_wait = "soon"\n',
                "bulkhead_max_wait = 'soon'",
                id="duration",
            ),
            pytest.param('[broker]\nurl = "http://x"\n', "broker.url = ***", id="broker-scheme"),
            pytest.param("[middleware]\nmax_json_depth = 0\n", "middleware.max_json_depth = 0", id="json-depth-0"),
            pytest.param(
                "[middleware]\nmax_json_depth = 201\n", "middleware.max_json_depth = 201", id="json-depth-over-200"
            ),
        ],
    )
    def test_bad_value_names_key_and_value(self, tmp_path: Path, text: str, fragment: str) -> None:
        with pytest.raises(ConfigError) as info:
            load_settings(write(tmp_path, text), environ={})
        assert fragment in str(info.value)

    def test_include_and_exclude_paths_together_are_rejected(self, tmp_path: Path) -> None:
        path = write(tmp_path, '[token]\ninclude_paths = ["/a"]\nexclude_paths = ["/b"]\n')
        with pytest.raises(ConfigError, match=r"token.include_paths and token.exclude_paths are both set"):
            load_settings(path, environ={})

    def test_policy_enabled_without_path_is_rejected(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match=r"policy.policy_path is not set"):
            load_settings(write(tmp_path, "[policy]\nenabled = true\n"), environ={})

    def test_breaker_threshold_is_clamped_not_rejected(self, tmp_path: Path) -> None:
        text = "[middleware.resilience]\ncircuit_breaker_threshold = 1.7\n"
        assert load_settings(write(tmp_path, text), environ={}).middleware.resilience.circuit_breaker_threshold == 1.0

    def test_durations_accept_units(self, tmp_path: Path) -> None:
        text = '[middleware.resilience]\nbulkhead_max_wait = "250ms"\n'
        assert load_settings(write(tmp_path, text), environ={}).middleware.resilience.bulkhead_max_wait == 0.25


class TestEnvironment:
    def test_service_keys_have_no_section_part(self) -> None:
        assert load_settings(environ={"SERVICE_PORT": "9090"}).service.port == 9090

    def test_env_wins_over_file(self, tmp_path: Path) -> None:
        path = write(tmp_path, "[service]\nport = 9001\n")
        assert load_settings(path, environ={"SERVICE_PORT": "9002"}).service.port == 9002

    def test_keys_with_underscores_in_section_and_key(self) -> None:
        settings = load_settings(
            environ={
                "SERVICE_RATE_LIMIT_PER_USER_RPM": "77",
                "SERVICE_CACHE_STORE_MAX_CONNECTIONS": "3",
                "SERVICE_TOKEN_PUBLIC_KEY_PATH": "/keys/pub.pem",
                "SERVICE_MIDDLEWARE_RESILIENCE_BULKHEAD_MAX_CONCURRENT": "9",
                "SERVICE_MIDDLEWARE_TIMEOUT_SECS": "4",
            }
        )
        assert settings.rate_limit.per_user_rpm == 77
        assert settings.cache_store.max_connections == 3
        assert settings.token.public_key_path == "/keys/pub.pem"
        assert settings.middleware.resilience.bulkhead_max_concurrent == 9
        assert settings.middleware.timeout_secs == 4

    def test_broker_url_override(self) -> None:
        settings = load_settings(environ={"SERVICE_BROKER_URL": "nats://10.0.0.1:4222"})
        assert settings.broker is not None
        assert settings.broker.url.get_secret_value() == "nats://10.0.0.1:4222"

    def test_jwt_prefix_is_an_alias(self) -> None:
        assert load_settings(environ={"SERVICE_JWT_LEEWAY_SECONDS": "7"}).token.leeway_seconds == 7

    @pytest.mark.parametrize("raw", ['["/a", "/b/*"]', "/a, /b/*"], ids=["json", "comma"])
    def test_list_values(self, raw: str) -> None:
        assert load_settings(environ={"SERVICE_TOKEN_EXCLUDE_PATHS": raw}).token.exclude_paths == [
            "/a",
            "/b/*",
        ]

    def test_bad_env_value_names_the_variable(self) -> None:
        with pytest.raises(ConfigError, match=r"SERVICE_RATE_LIMIT_WINDOW_SECS='soon' \(rate_limit.window_secs\)"):
            load_settings(environ={"SERVICE_RATE_LIMIT_WINDOW_SECS": "soon"})

    def test_unknown_variable_is_a_warning_not_an_error(self) -> None:
        with capture_logs() as logs:
            settings = load_settings(environ={"SERVICE_FROBNICATE": "1"})
        assert settings.service.port == 8080
        assert {
            "event": "unknown_environment_variable",
            "variable": "SERVICE_FROBNICATE",
            "log_level": "warning",
        } in logs

    def test_unrelated_variables_are_ignored(self) -> None:
        assert load_settings(environ={"HOME": "/root", "KUBERNETES_SERVICE_HOST": "x"}).service.port == 8080


class TestMasking:
    def test_secrets_and_url_passwords_are_masked(self) -> None:
        settings = load_settings(
            environ={
                "SERVICE_TOKEN_ALGORITHM": "HS256",
                "SERVICE_TOKEN_SECRET": "hunter2",
                "SERVICE_BROKER_URL": "nats://app:s3cret@nats:4222",
                "SERVICE_CACHE_STORE_URL": "redis://:pw@valkey:6379/0",
            }
        )
        shown = masked(settings)
        assert shown["token"]["secret"] == "***"
        assert shown["broker"]["url"] == "nats://app:***@nats:4222"
        assert shown["cache_store"]["url"] == "redis://:***@valkey:6379/0"
        assert "hunter2" not in repr(shown) and "s3cret" not in repr(shown)

    def test_secret_value_never_appears_in_an_error(self) -> None:
        with pytest.raises(ConfigError) as info:
            load_settings(environ={"SERVICE_BROKER_URL": "http://user:topsecret@x"})
        assert "topsecret" not in str(info.value)
