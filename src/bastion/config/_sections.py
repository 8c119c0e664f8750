"""The settings sections: one frozen pydantic model per TOML table, with the spec's keys and defaults.

Pure data and validation of single values; reading files and the environment is ``_load`` and ``_env``. The
value types are in ``_values``, the broker's tables in ``_messaging``, audit, metrics and tracing in
``_observability``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import structlog
from pydantic import AliasChoices, BeforeValidator, Field, SecretStr, field_validator, model_validator

from bastion.config._limits import IdempotencySettings, RateLimitSettings
from bastion.config._messaging import BrokerSettings
from bastion.config._observability import AuditSettings, MetricsSettings, TracingSettings
from bastion.config._tls import TlsSettings
from bastion.config._values import Bool, Duration, Port, PositiveDuration, PositiveInt, Section, check_path_prefix

log = structlog.get_logger("bastion.config")

DEFAULT_PORT = 8080
DEFAULT_BASE_PATH = "/api"
DEFAULT_CACHE_TTL_SECS = 300


class ServiceSettings(Section):
    """``[service]``: identity, listener and logging."""

    name: str | None = None
    version: str | None = None
    host: str = "0.0.0.0"
    port: Port = DEFAULT_PORT
    base_path: str = DEFAULT_BASE_PATH
    workers: PositiveInt = 1
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    log_format: Literal["auto", "json", "console"] = "auto"
    graceful_shutdown_secs: Duration = 30.0
    ready_timeout_secs: Duration = 2.0
    tls_cert_path: str | None = None
    tls_key_path: str | None = None
    # Listener limits (docs/configuration.md "[service]"): what one connection may make the process hold.
    max_header_bytes: Annotated[int, Field(ge=1024, le=1_048_576)] = 65_536
    max_headers: Annotated[int, Field(ge=8, le=10_000)] = 100
    header_read_timeout_secs: PositiveDuration = 10.0
    keep_alive_timeout_secs: PositiveDuration = 5.0
    max_connections: Annotated[int, Field(ge=1)] = 1024
    """Open connections per process and port, HTTP/1.1, WebSocket and HTTP/2 alike, counted from the accept."""
    max_connections_per_ip: Annotated[int, Field(ge=0)] = 256
    """Open connections from one client address per process and port; ``0`` turns the cap off (behind a proxy
    that concentrates clients on its own address, raise it or turn it off)."""
    max_pipelined_requests: Annotated[int, Field(ge=1, le=1024)] = 32
    """HTTP/1.1 requests parsed ahead of the one being answered on a connection; past it, reading stops."""
    compiled_handlers: Bool = True
    """Serve the FastAPI routes of the common shapes through a handler compiled at start-up (docs/pipeline.md,
    "Compiled handlers"); ``false`` keeps FastAPI's own handler for every route."""
    api_docs_public: Bool = True
    """Serve each version's Swagger UI, ReDoc and OpenAPI document without a token or a policy decision
    (docs/api-docs.md); ``false`` puts them behind token auth and policy like any route."""
    deprecation_header: Literal["version", "rfc9745"] = "version"
    """The form of a deprecated version's ``Deprecation`` header: the spec's ``version="v1"``, or RFC 9745's
    ``@<Unix seconds>`` of the date the version was deprecated (every deprecation then needs ``since``)."""

    @model_validator(mode="after")
    def _tls_pair(self) -> ServiceSettings:
        if (self.tls_cert_path is None) != (self.tls_key_path is None):
            raise ValueError("service.tls_cert_path and service.tls_key_path must be set together")
        return self

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_level(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("base_path")
    @classmethod
    def _base_path(cls, value: str) -> str:
        return check_path_prefix(value)


Algorithm = Literal["RS256", "RS384", "RS512", "ES256", "ES384", "HS256", "HS384", "HS512"]


JWT_KEY_SOURCES = ("public_key_path", "secret", "jwks_path", "jwks_url")
PASETO_KEYS = ("key_path", "version", "purpose")


class TokenSettings(Section):
    """``[token]`` (alias ``[jwt]``): bearer-token validation.

    On when the section names a key source (``public_key_path``, ``secret``, ``jwks_path``, ``jwks_url``,
    ``key_path``) or says ``enabled = true``; off only with an explicit ``enabled = false``. Neither is a
    start-up refusal (see the start-up check in ``bastion/_security.py``), never an open service.
    """

    enabled: Bool | None = None
    format: Literal["jwt", "paseto"] = "jwt"
    algorithm: Algorithm = "RS256"
    secret: SecretStr | None = None
    public_key_path: str | None = None
    jwks_path: str | None = None
    jwks_url: str | None = None
    jwks_refresh_secs: Duration = 300.0
    version: Literal["v4"] = "v4"
    purpose: Literal["local", "public"] = "public"
    key_path: str | None = None
    revocation_enabled: Bool = False
    leeway_seconds: Annotated[int, Field(ge=0, le=3600)] = 60
    required_audience: str | None = None
    required_issuer: str | None = None
    exclude_paths: list[str] = Field(default_factory=list)
    include_paths: list[str] = Field(default_factory=list)
    public_paths: list[str] = Field(default_factory=list)
    max_token_bytes: Annotated[int, Field(ge=256, le=65536)] = 8192
    verified_cache_size: Annotated[int, Field(ge=0)] = 10_000

    @property
    def key_sources(self) -> list[str]:
        """The key-source keys that are set (``public_key_path``, ``secret``, ``jwks_*``, ``key_path``)."""
        return [name for name in (*JWT_KEY_SOURCES, "key_path") if getattr(self, name) is not None]

    @property
    def active(self) -> bool:
        """Whether token authentication runs: ``enabled = true``, or a key source and no ``enabled = false``."""
        return self.enabled is True or (self.enabled is None and bool(self.key_sources))

    @model_validator(mode="after")
    def _consistent(self) -> TokenSettings:
        if self.include_paths and self.exclude_paths:
            raise ValueError(
                "token.include_paths and token.exclude_paths are both set; use one: include_paths "
                "protects only the listed paths, exclude_paths makes the listed paths public"
            )
        if self.enabled is False:
            return self
        if self.format == "jwt":
            self._check_jwt_sources()
        else:
            self._check_paseto_sources()
        return self

    def _check_jwt_sources(self) -> None:
        paseto = [f"token.{name}" for name in PASETO_KEYS if name in self.model_fields_set]
        if paseto:
            raise ValueError(f"{', '.join(paseto)} set but token.format is 'jwt'; set token.format = 'paseto'")
        sources = [name for name in JWT_KEY_SOURCES if getattr(self, name) is not None]
        if len(sources) > 1:
            raise ValueError(
                f"token.{' and token.'.join(sources)} are both set; a {self.algorithm} key comes from one of "
                "token.public_key_path, token.secret, token.jwks_path, token.jwks_url"
            )
        if self.enabled and not sources:
            raise ValueError(
                "token.enabled is true but no key is set: set token.public_key_path, token.secret, "
                "token.jwks_path or token.jwks_url"
            )
        if self.secret is not None and not self.algorithm.startswith("HS"):
            raise ValueError(
                f"token.secret is for HS256/HS384/HS512; token.algorithm = {self.algorithm!r} needs "
                "token.public_key_path, token.jwks_path or token.jwks_url"
            )
        if self.public_key_path is not None and self.algorithm.startswith("HS"):
            raise ValueError(
                f"token.public_key_path is for RS*/ES* keys; token.algorithm = {self.algorithm!r} needs token.secret"
            )

    def _check_paseto_sources(self) -> None:
        jwt_keys = [f"token.{name}" for name in (*JWT_KEY_SOURCES, "algorithm") if name in self.model_fields_set]
        if jwt_keys:
            raise ValueError(f"{', '.join(jwt_keys)} set but token.format is 'paseto', which reads token.key_path")
        if self.key_path is None:
            raise ValueError("token.format = 'paseto' needs token.key_path")


class PolicySettings(Section):
    """``[policy]``: Cedar policy authorization, on when ``policy_path`` is set unless ``enabled = false``."""

    enabled: Bool | None = None
    policy_path: str | None = Field(default=None, validation_alias=AliasChoices("policy_path", "policies_path"))
    hot_reload: Bool = False
    hot_reload_interval_secs: Annotated[float, Field(gt=0)] = 5.0
    cache_enabled: Bool = True
    cache_ttl_secs: Annotated[int, Field(ge=0)] = DEFAULT_CACHE_TTL_SECS
    cache_size: Annotated[int, Field(ge=0)] = 10_000
    cache_backend: Literal["memory", "cache_store"] = "memory"
    fail_open: Bool = False

    @property
    def active(self) -> bool:
        """Whether policies decide requests: a ``policy_path`` (or ``enabled = true``) and no ``enabled = false``."""
        return self.enabled is True or (self.enabled is None and self.policy_path is not None)

    @model_validator(mode="after")
    def _path_when_enabled(self) -> PolicySettings:
        if self.enabled and not self.policy_path:
            raise ValueError("policy.enabled is true but policy.policy_path is not set")
        return self


class CacheStoreSettings(Section):
    """``[cache_store]``: Redis/Valkey URL; in-process memory when unset."""

    url: SecretStr | None = None
    max_connections: PositiveInt = 10
    timeout_secs: Annotated[float, Field(gt=0)] = 1.0


def _clamp_unit(value: object) -> object:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return value
    if isinstance(value, int | float) and not isinstance(value, bool) and not 0.0 <= value <= 1.0:
        clamped = min(1.0, max(0.0, float(value)))
        log.warning("config_value_clamped", key="middleware.resilience.circuit_breaker_threshold", value=value)
        return clamped
    return value


REMOVED_RESILIENCE_PREFIX = "retry_"


class ResilienceSettings(Section):
    """``[middleware.resilience]``: the values the operator's layers are built from (``service.use_resilience()``).

    Not applied automatically (spec): a layer exists only where the operator asks for one. Each layer has a
    circuit breaker unless ``circuit_breaker_enabled = false`` and a bulkhead unless ``bulkhead_enabled =
    false``. The former ``retry_*`` keys were removed from the spec and "do nothing": they are accepted,
    ignored and warned about once per load (``config_key_ignored``); any other unknown key is an error.
    """

    circuit_breaker_enabled: Bool | None = None
    circuit_breaker_threshold: Annotated[float, BeforeValidator(_clamp_unit)] = 0.5
    circuit_breaker_min_requests: PositiveInt = 10
    circuit_breaker_wait_secs: PositiveInt = 30
    circuit_breaker_half_open_requests: PositiveInt = 1
    bulkhead_enabled: Bool | None = None
    bulkhead_max_concurrent: PositiveInt = 100
    bulkhead_max_wait: PositiveDuration = 5.0

    @model_validator(mode="before")
    @classmethod
    def _drop_removed_retry_keys(cls, data: object) -> object:
        if not isinstance(data, Mapping):
            return data
        removed = sorted(key for key in data if isinstance(key, str) and key.startswith(REMOVED_RESILIENCE_PREFIX))
        for key in removed:
            log.warning(
                "config_key_ignored",
                key=f"middleware.resilience.{key}",
                reason="retry is not a server-side layer; the retry_* keys were removed and do nothing",
            )
        return {key: value for key, value in data.items() if key not in removed}


class CorsSettings(Section):
    """``[middleware.cors]``: off until ``allow_origins`` lists an origin."""

    allow_origins: list[str] = Field(default_factory=list)
    allow_origin_regex: str | None = None
    allow_methods: list[str] = Field(default_factory=lambda: ["GET", "POST", "PUT", "PATCH", "DELETE"])
    allow_headers: list[str] = Field(default_factory=lambda: ["authorization", "content-type", "x-request-id"])
    allow_credentials: Bool = False
    expose_headers: list[str] = Field(
        default_factory=lambda: [
            "x-request-id",
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "ratelimit",
            "ratelimit-policy",
            "idempotent-replayed",
            "retry-after",
            "deprecation",
            "sunset",
            "link",
            "warning",
        ]
    )
    max_age: Annotated[int, Field(ge=0)] = 600

    @field_validator("allow_origin_regex")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value


class SecurityHeadersSettings(Section):
    """``[middleware.security_headers]``: set on every response unless the handler set them."""

    enabled: Bool = True
    content_type_options: str = "nosniff"
    frame_options: str = "DENY"
    referrer_policy: str = "no-referrer"
    hsts_max_age: Annotated[int, Field(ge=0)] = 31_536_000
    hsts_include_subdomains: Bool = True
    content_security_policy: str | None = None


class AccessLogSettings(Section):
    """``[middleware.access_log]``: one structured line per request."""

    enabled: Bool = True
    include_headers: Bool = False
    sensitive_headers: list[str] = Field(
        default_factory=lambda: [
            "authorization",
            "proxy-authorization",
            "cookie",
            "set-cookie",
            "x-api-key",
            "x-auth-token",
            "x-csrf-token",
        ]
    )


class CompressionSettings(Section):
    """``[middleware.compression]``: gzip above a size threshold."""

    enabled: Bool = True
    minimum_size: Annotated[int, Field(ge=0)] = 1024
    level: Annotated[int, Field(ge=1, le=9)] = 6


DEFAULT_MAX_JSON_DEPTH = 64
"""Open arrays and objects a JSON body may nest: System.Text.Json's default (serde_json stops at 128). Real
documents stay near ten levels."""
MAX_JSON_DEPTH = 200
"""The highest ``max_json_depth`` accepted: below pydantic's serializer limit (255 levels), with room for a
handler that wraps what it received; Python's recursive decoder fails near 1000."""


class MiddlewareSettings(Section):
    """``[middleware]``: request limits plus the sub-sections of the stack."""

    timeout_secs: Annotated[float, Field(gt=0)] = 30.0
    max_body_bytes: PositiveInt = 1_048_576
    max_json_depth: Annotated[int, Field(ge=1, le=MAX_JSON_DEPTH)] = DEFAULT_MAX_JSON_DEPTH
    resilience: ResilienceSettings = Field(default_factory=ResilienceSettings)
    cors: CorsSettings = Field(default_factory=CorsSettings)
    security_headers: SecurityHeadersSettings = Field(default_factory=SecurityHeadersSettings)
    access_log: AccessLogSettings = Field(default_factory=AccessLogSettings)
    compression: CompressionSettings = Field(default_factory=CompressionSettings)


class GrpcSettings(Section):
    """``[grpc]``: gRPC on the main port (protocol detection) or a separate one."""

    enabled: Bool = False
    use_separate_port: Bool = False
    port: Port = 9090
    max_message_size: PositiveInt = 4 * 1024 * 1024
    # HTTP/2 limits (docs/grpc.md "Limits"), for every HTTP/2 connection on the main port and on grpc.port. The
    # flood limits carry Envoy's names and defaults.
    max_concurrent_streams: Annotated[int, Field(ge=1, le=10_000)] = 100
    idle_timeout_secs: PositiveDuration = 60.0
    keepalive_interval_secs: Duration = 0.0
    keepalive_timeout_secs: PositiveDuration = 20.0
    max_outbound_frames: Annotated[int, Field(ge=1)] = 10_000
    max_outbound_control_frames: Annotated[int, Field(ge=1)] = 1_000
    max_inbound_control_frames_per_sec: Annotated[float, Field(gt=0)] = 100.0
    max_consecutive_inbound_frames_with_empty_payload: Annotated[int, Field(ge=0)] = 1
    max_inbound_priority_frames_per_stream: Annotated[int, Field(ge=0)] = 100
    max_inbound_window_update_frames_per_data_frame_sent: Annotated[int, Field(ge=1)] = 10


class AppTable(Section):
    """The ``[app]`` table and the ``SERVICE_APP_*`` variables as they were read, not validated here.

    The app's own model validates them when the service is built (``Service(settings=...)``); a service
    without one refuses a non-empty table (``bastion.config._app``).
    """

    table: dict[str, Any] = Field(default_factory=dict)
    environ: dict[str, str] = Field(default_factory=dict)
    origin: str = "embedded defaults"


class Settings(Section):
    """The whole configuration, one frozen object."""

    service: ServiceSettings = Field(default_factory=ServiceSettings)
    token: TokenSettings = Field(default_factory=TokenSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    cache_store: CacheStoreSettings = Field(default_factory=CacheStoreSettings)
    rate_limit: RateLimitSettings = Field(default_factory=RateLimitSettings)
    idempotency: IdempotencySettings = Field(default_factory=IdempotencySettings)
    middleware: MiddlewareSettings = Field(default_factory=MiddlewareSettings)
    broker: BrokerSettings | None = None
    audit: AuditSettings = Field(default_factory=AuditSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    grpc: GrpcSettings = Field(default_factory=GrpcSettings)
    tls: TlsSettings = Field(default_factory=TlsSettings)
    app: AppTable = Field(default_factory=AppTable)

    @model_validator(mode="after")
    def _ports_differ(self) -> Settings:
        if self.tls.mtls and self.service.tls_cert_path is None:
            raise ValueError("tls.client_auth needs TLS: set service.tls_cert_path and service.tls_key_path")
        port = self.metrics.port
        if port is None or not self.metrics.enabled:
            return self
        if port == self.service.port:
            raise ValueError(f"metrics.port {port} is service.port too: choose another port or remove metrics.port")
        if self.grpc.enabled and self.grpc.use_separate_port and port == self.grpc.port:
            raise ValueError(f"metrics.port {port} is grpc.port too: choose another port or remove metrics.port")
        return self
