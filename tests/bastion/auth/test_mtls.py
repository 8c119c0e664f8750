"""``[tls]`` settings and the per-path credential rules."""

from __future__ import annotations

import pytest

from bastion import ConfigError, load_settings
from bastion.auth._mtls import CredentialRules, CredentialsGuard
from bastion.config import TlsSettings

TLS_ON = {"SERVICE_TLS_CLIENT_AUTH": "optional", "SERVICE_TLS_CLIENT_CA_PATH": "ca.pem"}
SERVER = {"SERVICE_TLS_CERT_PATH": "c.pem", "SERVICE_TLS_KEY_PATH": "k.pem"}


def test_longest_pattern_wins_and_an_exact_path_beats_a_prefix() -> None:
    rules = CredentialRules.from_settings(
        TlsSettings(
            client_auth="optional",
            client_ca_path="ca.pem",
            path_credentials={
                "/api/*": "mtls_or_bearer",
                "/api/v1/internal/*": "mtls",
                "/api/v1/internal/open": "bearer",
            },
        )
    )
    assert rules.for_path("/api/v1/internal/jobs") == "mtls"
    assert rules.for_path("/api/v1/internal/open") == "bearer"
    assert rules.for_path("/api/v2/things") == "mtls_or_bearer"
    assert rules.for_path("/other") == "bearer"


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"SERVICE_TLS_CLIENT_AUTH": "required", **SERVER}, 'tls.client_auth = "required" needs tls.client_ca_path'),
        ({**TLS_ON}, "tls.client_auth needs TLS: set service.tls_cert_path and service.tls_key_path"),
        ({"SERVICE_TLS_DEFAULT_CREDENTIALS": "mtls", **SERVER}, "accept mtls: set tls.client_auth"),
        ({"SERVICE_TLS_CRL_PATH": "crl.pem", **SERVER}, "tls.crl_path needs tls.client_ca_path"),
        ({"SERVICE_TLS_CLIENT_AUTH": "sometimes"}, "client_auth"),
        ({"SERVICE_TLS_IDENTITY_FROM": '["cn", "cn"]'}, "distinct sources"),
    ],
)
def test_inconsistent_tls_settings_refuse_to_load(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(environ={"SERVICE_TOKEN_ENABLED": "false", **environ})


def test_a_bad_path_pattern_is_refused() -> None:
    with pytest.raises(ValueError, match="must be an absolute path"):
        TlsSettings(client_auth="optional", client_ca_path="ca.pem", path_credentials={"api/*": "mtls"})


def test_mtls_and_bearer_without_token_auth_is_a_config_error() -> None:
    settings = TlsSettings(
        client_auth="optional", client_ca_path="ca.pem", path_credentials={"/ledger": "mtls_and_bearer"}
    )
    with pytest.raises(ConfigError, match="mtls_and_bearer needs token authentication"):
        CredentialsGuard(settings, token=None)


def test_posture_and_check_config_show_the_tls_settings() -> None:
    from bastion._tls import posture, posture_line

    settings = load_settings(
        environ={
            "SERVICE_TOKEN_ENABLED": "false",
            **SERVER,
            **TLS_ON,
            "SERVICE_TLS_CRL_PATH": "crl.pem",
            "SERVICE_TLS_DEFAULT_CREDENTIALS": "mtls",
        }
    )
    assert posture(settings) == {
        "client_auth": "optional",
        "reload_interval_secs": 10.0,
        "crl": True,
        "identity_from": ["spiffe", "dns", "cn"],
        "default_credentials": "mtls",
        "path_credentials": {},
    }
    assert posture_line(settings) == (
        "tls: on (client certificates optional, CRL checked; identity from spiffe>dns>cn; credentials mtls by default; "
        "files re-read every 10s and on SIGHUP)"
    )
    assert posture_line(load_settings(environ={"SERVICE_TOKEN_ENABLED": "false"})) == "tls: off"
