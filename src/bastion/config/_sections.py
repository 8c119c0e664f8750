"""The settings sections: one frozen pydantic model per TOML table, with the spec's keys and defaults.

Pure data and validation of single values; reading files and the environment is ``_load`` and ``_env``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Literal

import structlog
from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    Strict,
    field_validator,
    model_validator,
)

log = structlog.get_logger("bastion.config")

DEFAULT_PORT = 8080
DEFAULT_BASE_PATH = "/api"
DEFAULT_CACHE_TTL_SECS = 300

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def _parse_duration(value: object) -> object:
    """Seconds from a number or a string such as ``"5s"``, ``"250ms"``, ``"1m"``, ``"7d"``."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            raise ValueError("expected a duration such as 5, '5s', '250ms' or '1m'")
        return float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    return value


Duration = Annotated[float, BeforeValidator(_parse_duration), Field(ge=0)]
PositiveDuration = Annotated[float, BeforeValidator(_parse_duration), Field(gt=0)]
# TOML has real booleans: ``enabled = "yes"`` is a mistake to report, not a value to guess at. Environment
# values (always strings) are converted by _env_value, which accepts only true/false/1/0.
Bool = Annotated[bool, Strict()]
Port = Annotated[int, Field(ge=0, le=65535)]
PositiveInt = Annotated[int, Field(gt=0)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _check_path_prefix(value: str) -> str:
    if not value.startswith("/") or "//" in value or any(c.isspace() for c in value):
        raise ValueError("expected an absolute URL path such as '/api'")
    return value.rstrip("/") if value != "/" else ""


class ServiceSettings(_Section):
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
    """Serve the FastAPI routes of the common shapes through a handler compiled at start-up (docs/performance.md);
    ``false`` keeps FastAPI's own handler for every route."""
    api_docs_public: Bool = True
    """Serve each version's Swagger UI, ReDoc and OpenAPI document without a token or a policy decision
    (docs/api-docs.md); ``false`` puts them behind token auth and policy like any route."""

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
        return _check_path_prefix(value)


Algorithm = Literal["RS256", "RS384", "RS512", "ES256", "ES384", "HS256", "HS384", "HS512"]


JWT_KEY_SOURCES = ("public_key_path", "secret", "jwks_path", "jwks_url")
PASETO_KEYS = ("key_path", "version", "purpose")


class TokenSettings(_Section):
    """``[token]`` (alias ``[jwt]``): bearer-token validation.

    On when the section names a key source (``public_key_path``, ``secret``, ``jwks_path``, ``jwks_url``,
    ``key_path``) or says ``enabled = true``; off only with an explicit ``enabled = false``. Neither is a
    start-up refusal (see :func:`bastion.startup.check_token_decision`), never an open service.
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


class PolicySettings(_Section):
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


class CacheStoreSettings(_Section):
    """``[cache_store]``: Redis/Valkey URL; in-process memory when unset."""

    url: SecretStr | None = None
    max_connections: PositiveInt = 10
    timeout_secs: Annotated[float, Field(gt=0)] = 1.0


class RouteRule(_Section):
    """One ``[rate_limit.routes."<pattern>"]`` entry: one rate (per second, minute or hour) and a burst."""

    requests_per_second: PositiveInt | None = None
    requests_per_minute: PositiveInt | None = None
    requests_per_hour: PositiveInt | None = None
    burst_size: PositiveInt | None = None
    per_user: Bool = True

    @model_validator(mode="after")
    def _one_rate(self) -> RouteRule:
        rates = [self.requests_per_second, self.requests_per_minute, self.requests_per_hour]
        if sum(rate is not None for rate in rates) != 1:
            raise ValueError("set exactly one of requests_per_second, requests_per_minute, requests_per_hour")
        return self


class RateLimitSettings(_Section):
    """``[rate_limit]``: per user, client and IP buckets with per-route rules."""

    enabled: Bool = True
    per_user_rpm: PositiveInt = 600
    per_client_rpm: PositiveInt = 1200
    per_ip_rpm: PositiveInt = 300
    window_secs: PositiveInt = 60
    burst_size: PositiveInt | None = None
    auto_apply: Bool = True
    distributed: Bool = False
    trust_forwarded_headers: Bool = False
    routes: dict[str, RouteRule] = Field(default_factory=dict)


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


class ResilienceSettings(_Section):
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


class CorsSettings(_Section):
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


class SecurityHeadersSettings(_Section):
    """``[middleware.security_headers]``: set on every response unless the handler set them."""

    enabled: Bool = True
    content_type_options: str = "nosniff"
    frame_options: str = "DENY"
    referrer_policy: str = "no-referrer"
    hsts_max_age: Annotated[int, Field(ge=0)] = 31_536_000
    hsts_include_subdomains: Bool = True
    content_security_policy: str | None = None


class AccessLogSettings(_Section):
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


class CompressionSettings(_Section):
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


class MiddlewareSettings(_Section):
    """``[middleware]``: request limits plus the sub-sections of the stack."""

    timeout_secs: Annotated[float, Field(gt=0)] = 30.0
    max_body_bytes: PositiveInt = 1_048_576
    max_json_depth: Annotated[int, Field(ge=1, le=MAX_JSON_DEPTH)] = DEFAULT_MAX_JSON_DEPTH
    resilience: ResilienceSettings = Field(default_factory=ResilienceSettings)
    cors: CorsSettings = Field(default_factory=CorsSettings)
    security_headers: SecurityHeadersSettings = Field(default_factory=SecurityHeadersSettings)
    access_log: AccessLogSettings = Field(default_factory=AccessLogSettings)
    compression: CompressionSettings = Field(default_factory=CompressionSettings)


RETENTIONS = {"limits": "limits", "interest": "interest", "workqueue": "workqueue", "work_queue": "workqueue"}
_SUBJECT_TOKEN = re.compile(r"^[^\s.*>]+$")


def check_subject(subject: str, *, wildcards: bool) -> str:
    """A NATS subject: dot-separated non-empty tokens; ``*`` (one token) and a last ``>`` only with ``wildcards``."""
    tokens = subject.split(".")
    for index, token in enumerate(tokens):
        if _SUBJECT_TOKEN.match(token):
            continue
        if wildcards and (token == "*" or (token == ">" and index == len(tokens) - 1)):
            continue
        kind = (
            "a subject (tokens separated by dots; '*' and a last '>' as wildcards)"
            if wildcards
            else ("a subject without wildcards (tokens separated by dots)")
        )
        raise ValueError(f"{subject!r} is not {kind}")
    return subject


def _retention(value: object) -> object:
    if isinstance(value, str):
        retention = RETENTIONS.get(value.strip().lower())
        if retention is None:
            raise ValueError("expected one of Limits, Interest, WorkQueue")
        return retention
    return value


class StreamSettings(_Section):
    """``[broker.streams.<NAME>]``: a JetStream stream, created (or updated) at start-up."""

    subjects: list[str]
    max_messages: Annotated[int, Field(ge=-1)] = -1
    max_age: Duration = 0.0
    retention: Annotated[Literal["limits", "interest", "workqueue"], BeforeValidator(_retention)] = "limits"

    @field_validator("subjects")
    @classmethod
    def _subjects(cls, subjects: list[str]) -> list[str]:
        if not subjects:
            raise ValueError("a stream needs at least one subject")
        return [check_subject(subject, wildcards=True) for subject in subjects]


class BrokerSettings(_Section):
    """``[broker]``: NATS JetStream; on when ``url`` is set (or ``SERVICE_BROKER_URL``) unless ``enabled = false``."""

    enabled: Bool | None = None
    url: SecretStr | None = None
    name: str | None = None
    max_reconnects: Annotated[int, Field(ge=-1)] = 60
    max_retries: Annotated[int, Field(ge=0)] = 3
    retry_delay_secs: Annotated[int, Field(ge=0)] = 1
    optional: Bool = False
    lazy_init: Bool = True
    connect_timeout_secs: PositiveDuration = 2.0
    drain_timeout_secs: PositiveDuration = 10.0
    dead_letter_prefix: str = "deadletter"
    streams: dict[str, StreamSettings] = Field(default_factory=dict)

    @field_validator("dead_letter_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        return check_subject(value, wildcards=False)

    @field_validator("streams")
    @classmethod
    def _stream_names(cls, streams: dict[str, StreamSettings]) -> dict[str, StreamSettings]:
        for name in streams:
            if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
                raise ValueError(f"stream name {name!r}: letters, digits, '-' and '_' only")
        return streams

    @property
    def active(self) -> bool:
        return self.enabled is not False and self.url is not None

    @field_validator("url")
    @classmethod
    def _scheme(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return value
        for part in value.get_secret_value().split(","):
            if not re.match(r"^(nats|tls|ws|wss)://[^\s/]+$", part.strip()):
                raise ValueError("expected nats://host:port (comma-separated for a cluster, tls:// for TLS)")
        return value

    @model_validator(mode="after")
    def _url_when_enabled(self) -> BrokerSettings:
        if self.enabled and self.url is None:
            raise ValueError("broker.enabled is true but broker.url is not set")
        return self


class AuditSettings(_Section):
    """``[audit]``: audit events to the log and, when a broker is configured, to the broker."""

    enabled: Bool = True
    audit_auth_events: Bool = True
    broker_subject_prefix: str = "bastion.audit"
    broker_buffer: PositiveInt = 1000

    @field_validator("broker_subject_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        return check_subject(value, wildcards=False)


DEFAULT_OTLP_ENDPOINT = "http://127.0.0.1:4318/v1/traces"


class MetricsSettings(_Section):
    """``[metrics]``: Prometheus metrics (docs/observability.md)."""

    enabled: Bool = True
    path: str = "/metrics"
    public: Bool = True
    """``true``: the main port answers ``path`` before token auth, rate limiting and policy. ``false``: it is
    an ordinary route behind them (a policy must permit ``GET <path>``)."""
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    """Serve the metrics on this port of ``service.host`` instead of the main port (``bastion run``)."""

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not re.fullmatch(r"/[A-Za-z0-9._~/-]*", value) or "//" in value:
            raise ValueError("expected an absolute path such as /metrics")
        return value


class TracingSettings(_Section):
    """``[tracing]``: OpenTelemetry traces exported over OTLP/HTTP (docs/observability.md). Off unless
    ``enabled = true`` or an ``endpoint`` is set (and no ``enabled = false``)."""

    enabled: Bool | None = None
    endpoint: str = DEFAULT_OTLP_ENDPOINT
    """The collector's OTLP/HTTP traces URL (protobuf), e.g. ``http://otel-collector:4318/v1/traces``."""
    sampling_ratio: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    """The share of new traces recorded; a caller's ``traceparent`` decides for the traces it starts."""
    export_timeout_secs: PositiveDuration = 10.0

    @property
    def active(self) -> bool:
        return self.enabled is True or (self.enabled is None and "endpoint" in self.model_fields_set)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s]*)?", value):
            raise ValueError("expected an http:// or https:// URL such as http://127.0.0.1:4318/v1/traces")
        return value


class GrpcSettings(_Section):
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


class Settings(_Section):
    """The whole configuration, one frozen object."""

    service: ServiceSettings = Field(default_factory=ServiceSettings)
    token: TokenSettings = Field(default_factory=TokenSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    cache_store: CacheStoreSettings = Field(default_factory=CacheStoreSettings)
    rate_limit: RateLimitSettings = Field(default_factory=RateLimitSettings)
    middleware: MiddlewareSettings = Field(default_factory=MiddlewareSettings)
    broker: BrokerSettings | None = None
    audit: AuditSettings = Field(default_factory=AuditSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    grpc: GrpcSettings = Field(default_factory=GrpcSettings)

    @model_validator(mode="after")
    def _ports_differ(self) -> Settings:
        port = self.metrics.port
        if port is None or not self.metrics.enabled:
            return self
        if port == self.service.port:
            raise ValueError(f"metrics.port {port} is service.port too: choose another port or remove metrics.port")
        if self.grpc.enabled and self.grpc.use_separate_port and port == self.grpc.port:
            raise ValueError(f"metrics.port {port} is grpc.port too: choose another port or remove metrics.port")
        return self
