"""Typed settings: one TOML file plus ``SERVICE_*`` environment overrides, validated at start-up.

Every key of the spec's configuration tables exists here with the spec's default (where the spec gives
none, the default is documented in ``docs/configuration.md``). :func:`load_settings` raises
:class:`~bastion.errors.ConfigError` naming the key and the bad value; the service never starts
half-configured.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import structlog
from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from bastion.errors import ConfigError

ENV_PREFIX = "SERVICE_"
DEFAULT_PORT = 8080
DEFAULT_BASE_PATH = "/api"
DEFAULT_CACHE_TTL_SECS = 300

log = structlog.get_logger("bastion.config")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def _parse_duration(value: object) -> object:
    """Seconds from a number or a string such as ``"5s"``, ``"250ms"``, ``"1m"``."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            raise ValueError("expected a duration such as 5, '5s', '250ms' or '1m'")
        return float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    return value


Duration = Annotated[float, BeforeValidator(_parse_duration), Field(ge=0)]
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


class TokenSettings(_Section):
    """``[token]`` (alias ``[jwt]``): bearer-token validation."""

    enabled: bool = False
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
    revocation_enabled: bool = False
    leeway_seconds: Annotated[int, Field(ge=0, le=3600)] = 60
    required_audience: str | None = None
    required_issuer: str | None = None
    exclude_paths: list[str] = Field(default_factory=list)
    include_paths: list[str] = Field(default_factory=list)
    public_paths: list[str] = Field(default_factory=list)
    max_token_bytes: Annotated[int, Field(ge=256, le=65536)] = 8192
    verified_cache_size: Annotated[int, Field(ge=0)] = 10_000

    @model_validator(mode="after")
    def _one_path_mode(self) -> TokenSettings:
        if self.include_paths and self.exclude_paths:
            raise ValueError(
                "token.include_paths and token.exclude_paths are both set; use one: include_paths "
                "protects only the listed paths, exclude_paths makes the listed paths public"
            )
        return self


class PolicySettings(_Section):
    """``[policy]``: Cedar policy authorization."""

    enabled: bool = False
    policy_path: str | None = Field(default=None, validation_alias=AliasChoices("policy_path", "policies_path"))
    hot_reload: bool = False
    hot_reload_interval_secs: Annotated[float, Field(gt=0)] = 5.0
    cache_enabled: bool = True
    cache_ttl_secs: Annotated[int, Field(ge=0)] = DEFAULT_CACHE_TTL_SECS
    cache_size: Annotated[int, Field(ge=0)] = 10_000
    fail_open: bool = False

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
    per_user: bool = True

    @model_validator(mode="after")
    def _one_rate(self) -> RouteRule:
        rates = [self.requests_per_second, self.requests_per_minute, self.requests_per_hour]
        if sum(rate is not None for rate in rates) != 1:
            raise ValueError("set exactly one of requests_per_second, requests_per_minute, requests_per_hour")
        return self


class RateLimitSettings(_Section):
    """``[rate_limit]``: per user, client and IP buckets with per-route rules."""

    enabled: bool = True
    per_user_rpm: PositiveInt = 600
    per_client_rpm: PositiveInt = 1200
    per_ip_rpm: PositiveInt = 300
    window_secs: PositiveInt = 60
    burst_size: PositiveInt | None = None
    auto_apply: bool = True
    distributed: bool = False
    trust_forwarded_headers: bool = False
    routes: dict[str, RouteRule] = Field(default_factory=dict)

    @field_validator("routes")
    @classmethod
    def _patterns(cls, routes: dict[str, RouteRule]) -> dict[str, RouteRule]:
        from bastion.ratelimit.rules import check_patterns  # late: the rules module is not needed to load settings

        check_patterns(routes)
        return routes


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


class ResilienceSettings(_Section):
    """``[middleware.resilience]``: read by the operator, who builds the layers (not auto-applied)."""

    circuit_breaker_enabled: bool = False
    circuit_breaker_threshold: Annotated[float, BeforeValidator(_clamp_unit)] = 0.5
    circuit_breaker_min_requests: PositiveInt = 10
    circuit_breaker_wait_secs: Annotated[int, Field(ge=0)] = 30
    bulkhead_enabled: bool = False
    bulkhead_max_concurrent: PositiveInt = 100
    bulkhead_max_wait: Duration = 5.0


class CorsSettings(_Section):
    """``[middleware.cors]``: off until ``allow_origins`` lists an origin."""

    allow_origins: list[str] = Field(default_factory=list)
    allow_origin_regex: str | None = None
    allow_methods: list[str] = Field(default_factory=lambda: ["GET", "POST", "PUT", "PATCH", "DELETE"])
    allow_headers: list[str] = Field(default_factory=lambda: ["authorization", "content-type", "x-request-id"])
    allow_credentials: bool = False
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

    enabled: bool = True
    content_type_options: str = "nosniff"
    frame_options: str = "DENY"
    referrer_policy: str = "no-referrer"
    hsts_max_age: Annotated[int, Field(ge=0)] = 31_536_000
    hsts_include_subdomains: bool = True
    content_security_policy: str | None = None


class AccessLogSettings(_Section):
    """``[middleware.access_log]``: one structured line per request."""

    enabled: bool = True
    include_headers: bool = False
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

    enabled: bool = True
    minimum_size: Annotated[int, Field(ge=0)] = 1024
    level: Annotated[int, Field(ge=1, le=9)] = 6


class MiddlewareSettings(_Section):
    """``[middleware]``: request limits plus the sub-sections of the stack."""

    timeout_secs: Annotated[float, Field(gt=0)] = 30.0
    max_body_bytes: PositiveInt = 1_048_576
    resilience: ResilienceSettings = Field(default_factory=ResilienceSettings)
    cors: CorsSettings = Field(default_factory=CorsSettings)
    security_headers: SecurityHeadersSettings = Field(default_factory=SecurityHeadersSettings)
    access_log: AccessLogSettings = Field(default_factory=AccessLogSettings)
    compression: CompressionSettings = Field(default_factory=CompressionSettings)


class BrokerSettings(_Section):
    """``[broker]``: NATS JetStream; absent section means no broker."""

    url: SecretStr
    name: str | None = None
    max_reconnects: Annotated[int, Field(ge=-1)] = 60
    max_retries: Annotated[int, Field(ge=0)] = 3
    retry_delay_secs: Annotated[int, Field(ge=0)] = 1
    optional: bool = False
    lazy_init: bool = True

    @field_validator("url")
    @classmethod
    def _scheme(cls, value: SecretStr) -> SecretStr:
        for part in value.get_secret_value().split(","):
            if not re.match(r"^(nats|tls|ws|wss)://[^\s/]+$", part.strip()):
                raise ValueError("expected nats://host:port (comma-separated for a cluster, tls:// for TLS)")
        return value


class AuditSettings(_Section):
    """``[audit]``: audit events to the log (and the broker, when one is configured)."""

    enabled: bool = True
    audit_auth_events: bool = True


class MetricsSettings(_Section):
    """``[metrics]``: OpenTelemetry metrics."""

    enabled: bool = True


class GrpcSettings(_Section):
    """``[grpc]``: gRPC on the main port (protocol detection) or a separate one."""

    enabled: bool = False
    use_separate_port: bool = False
    port: Port = 9090
    max_message_size: PositiveInt = 4 * 1024 * 1024


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
    grpc: GrpcSettings = Field(default_factory=GrpcSettings)


def _sections(model: type[BaseModel], path: tuple[str, ...] = ()) -> Iterable[tuple[tuple[str, ...], type[BaseModel]]]:
    yield path, model
    for name, field in model.model_fields.items():
        annotation = field.annotation
        candidates = getattr(annotation, "__args__", (annotation,))
        for candidate in candidates:
            if isinstance(candidate, type) and issubclass(candidate, _Section) and candidate is not RouteRule:
                yield from _sections(candidate, (*path, name))


# Env names are matched against section names longest first, so keys containing "_" work:
# SERVICE_RATE_LIMIT_PER_USER_RPM -> rate_limit.per_user_rpm, SERVICE_MIDDLEWARE_CORS_MAX_AGE ->
# middleware.cors.max_age. The [service] section's own keys have no section part: SERVICE_PORT.
_SECTION_MODELS: list[tuple[tuple[str, ...], type[BaseModel]]] = [*_sections(Settings), (("jwt",), TokenSettings)]
_ENV_SECTIONS: list[tuple[str, tuple[str, ...], type[BaseModel]]] = sorted(
    (("_".join(path), path, model) for path, model in _SECTION_MODELS if path),
    key=lambda item: len(item[0]),
    reverse=True,
)


def _env_value(model: type[BaseModel], key: str, raw: str) -> object:
    annotation = model.model_fields[key].annotation
    if getattr(annotation, "__origin__", None) is list:
        stripped = raw.strip()
        if stripped.startswith("["):
            return json.loads(stripped)
        return [item.strip() for item in stripped.split(",") if item.strip()]
    return raw


def _env_overrides(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    """Nested overrides from ``SERVICE_*`` variables and, for error messages, which variable set what."""
    overrides: dict[str, Any] = {}
    sources: dict[tuple[str, ...], str] = {}
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX) :].lower()
        target: tuple[tuple[str, ...], str, type[BaseModel]] | None = None
        for joined, path, model in _ENV_SECTIONS:
            if rest.startswith(joined + "_") and rest[len(joined) + 1 :] in model.model_fields:
                target = (path, rest[len(joined) + 1 :], model)
                break
        if target is None and rest in ServiceSettings.model_fields:
            target = (("service",), rest, ServiceSettings)
        if target is None:
            log.warning("unknown_environment_variable", variable=name)
            continue
        path, key, model = target
        if path == ("jwt",):
            path = ("token",)
        try:
            value = _env_value(model, key, raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{name}={raw!r}: expected a JSON array or a comma-separated list ({exc.msg})") from None
        node = overrides
        for part in path:
            node = node.setdefault(part, {})
        node[key] = value
        sources[(*path, key)] = name
    return overrides, sources


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def _fold_jwt_alias(data: dict[str, Any], origin: str) -> dict[str, Any]:
    """Accept ``[jwt]`` as the spec's other name for ``[token]``; a key set in both is an error."""
    if "jwt" not in data:
        return data
    jwt = data.pop("jwt")
    token = data.get("token", {})
    if not isinstance(jwt, dict) or not isinstance(token, dict):
        raise ConfigError(f"{origin}: [jwt] and [token] must be tables")
    both = sorted(set(jwt) & set(token))
    if both:
        raise ConfigError(f"{origin}: {', '.join(both)} set in both [jwt] and [token]; use one section")
    data["token"] = {**token, **jwt}
    return data


_SECRET_KEYS = frozenset({"secret", "url", "password"})


def _describe(loc: tuple[str | int, ...], value: object, sources: Mapping[tuple[str, ...], str]) -> str:
    key = ".".join(str(part) for part in loc)
    if isinstance(value, Mapping):
        return key
    shown = "***" if loc and str(loc[-1]) in _SECRET_KEYS else repr(value)
    env = sources.get(tuple(str(part) for part in loc))
    return f"{env}={shown} ({key})" if env else f"{key} = {shown}"


def _config_error(exc: ValidationError, origin: str, sources: Mapping[tuple[str, ...], str]) -> ConfigError:
    lines = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        if error["type"] == "extra_forbidden":
            lines.append(f"unknown key {'.'.join(str(p) for p in loc)!r}")
            continue
        message = str(error["msg"]).removeprefix("Value error, ")
        if loc:
            lines.append(f"{_describe(loc, error.get('input'), sources)}: {message}")
        else:
            lines.append(message)
    return ConfigError(f"invalid configuration ({origin}): " + "; ".join(lines))


def load_settings(path: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None) -> Settings:
    """Read ``path`` (TOML; embedded defaults when ``None``), apply ``SERVICE_*`` overrides, validate.

    Raises ConfigError naming the file, key and bad value for a missing file, a TOML syntax error, an
    unknown key or a value of the wrong type or range.
    """
    environ = os.environ if environ is None else environ
    origin = "embedded defaults"
    data: dict[str, Any] = {}
    if path is not None:
        origin = str(path)
        try:
            raw = Path(path).read_bytes()
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {origin}") from None
        except OSError as exc:
            raise ConfigError(f"cannot read config file {origin}: {exc.strerror}") from None
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise ConfigError(f"config file {origin} is not UTF-8") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {origin} is not valid TOML: {exc}") from None
        data = _fold_jwt_alias(data, origin)
    overrides, sources = _env_overrides(environ)
    try:
        return Settings.model_validate(_merge(data, overrides))
    except ValidationError as exc:
        raise _config_error(exc, origin, sources) from None


def masked(settings: Settings) -> dict[str, Any]:
    """The effective settings as plain data with secrets (and passwords in URLs) masked."""

    def walk(value: object) -> object:
        if isinstance(value, SecretStr):
            raw = value.get_secret_value()
            return re.sub(r"(?<=://)([^:/@]*):([^@]+)@", r"\1:***@", raw) if "://" in raw else "***"
        if isinstance(value, BaseModel):
            return {name: walk(getattr(value, name)) for name in type(value).model_fields}
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    result = walk(settings)
    assert isinstance(result, dict)
    return result
