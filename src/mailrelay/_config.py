"""MAIL_RELAY_* settings: a pydantic-settings model over the environment and `./.env`, validated once at start-up."""

from __future__ import annotations

import difflib
import ipaddress
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Literal, get_args

import httpx
from dotenv import dotenv_values
from pydantic import (
    AliasGenerator,
    BeforeValidator,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticUseDefault
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from bastion_core import ConfigError, mask_url

PREFIX = "MAIL_RELAY_"
ENV_FILE = ".env"
DEFAULT_PORT = 2525
DEFAULT_HEALTH_PORT = 8080
DEFAULT_WEBHOOK_TIMEOUT_SECS = 30.0
DEFAULT_WEBHOOK_MAX_RETRIES = 3
DEFAULT_WEBHOOK_BACKOFF_BASE_SECS = 1.0
DEFAULT_BREAKER_FAILURE_RATE = 0.5
DEFAULT_BREAKER_MIN_REQUESTS = 10
DEFAULT_BREAKER_HALF_OPEN_REQUESTS = 1
DEFAULT_BREAKER_RESET_SECS = 60.0
DEFAULT_MAX_MESSAGE_SIZE = 26_214_400
DEFAULT_MAX_ATTACHMENT_SIZE = 10_485_760
DEFAULT_MAX_CONCURRENT_PER_IP = 10
# Postfix's default smtpd process limit: sessions beyond it get 421 instead of memory.
DEFAULT_MAX_SESSIONS = 100
DEFAULT_MAX_UNKNOWN_RCPTS = 3
DEFAULT_IDLE_TIMEOUT_SECS = 300.0  # RFC 5321 4.5.3.2.7: server timeout of 5 minutes
DEFAULT_SHUTDOWN_GRACE_SECS = 30.0
MAX_WEBHOOK_RETRIES = 20
DEFAULT_DNS_TIMEOUT_SECS = 5.0  # per DNS query; RFC 7208 4.6.4 suggests 20 s for a whole SPF check
DEFAULT_S3_TIMEOUT_SECS = 30.0
DEFAULT_QUEUE_STREAM = "MAILRELAY"
DEFAULT_QUEUE_WORKERS = 16
DEFAULT_QUEUE_MAX_ATTEMPTS = 25
MAX_QUEUE_ATTEMPTS = 1000
DEFAULT_QUEUE_MAX_AGE_SECS = 86_400.0  # a day; the sending server's own queue would have kept it ~5 days
DEFAULT_QUEUE_ACK_WAIT_SECS = 60.0
MAX_PRESIGN_SECS = 604_800  # SigV4 presigned URLs live at most 7 days
DNS_PORT = 53
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
REDACTED = "<redacted>"
_REQUIRED = "a value (this variable is required)"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})
_EMAIL = re.compile(r"^[^@\s,<>]+@[^@\s,<>]+$")
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$")
_SECRETS = frozenset({PREFIX + "WEBHOOK_SIGNING_SECRET"})
_STREAM_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # a stream name is also a subject token here
_NATS_SCHEMES = ("nats", "tls", "ws", "wss")

LogFormat = Literal["auto", "json", "console"]  # as Bastion's service.log_format
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)
DmarcMode = Literal["off", "monitor", "enforce"]
DMARC_MODES: tuple[str, ...] = get_args(DmarcMode)
QueueMode = Literal["direct", "jetstream"]
QUEUE_MODES: tuple[str, ...] = get_args(QueueMode)
AttachmentDelivery = Literal["inline", "s3"]
ATTACHMENT_DELIVERIES: tuple[str, ...] = get_args(AttachmentDelivery)
PolicyAction = Literal["drop", "reject"]
POLICY_ACTIONS: tuple[str, ...] = get_args(PolicyAction)
_MIME_TOKEN = r"[a-z0-9!#$&^_.+-]+"
_MIME_PATTERN = re.compile(rf"^(\*/\*|{_MIME_TOKEN}/(\*|{_MIME_TOKEN}))$")
_EXTENSION = re.compile(r"^[a-z0-9_+~-]{1,32}$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")  # S3 bucket naming rules (DNS-compatible)
_KEY_PREFIX = re.compile(r"^[A-Za-z0-9!_.*'()/-]{0,512}$")  # S3's "safe characters" for object keys
_REGION = re.compile(r"^[a-z0-9-]{1,64}$")


def _variable(field_name: str) -> str:
    return PREFIX + field_name.upper()


def _read(raw: object, convert: Callable[[str], object], *, required: bool = False, secret: bool = False) -> object:
    """One variable's text through its converter. Whitespace around a value is dropped and a blank value means
    unset (the default), except for a secret, which is taken verbatim; a value given in Python passes as is."""
    if not isinstance(raw, str):
        return raw
    if secret:
        return convert(raw)
    if not raw.strip():
        if required:
            raise ValueError(_REQUIRED)
        raise PydanticUseDefault()
    return convert(raw.strip())


def _env(convert: Callable[[str], object], *, required: bool = False, secret: bool = False) -> BeforeValidator:
    return BeforeValidator(lambda raw: _read(raw, convert, required=required, secret=secret))


def _email_list(raw: str) -> frozenset[str]:
    emails = [part.strip().lower() for part in raw.split(",") if part.strip()]
    bad = [e for e in emails if not _EMAIL.match(e)]
    if not emails or bad:
        raise ValueError("a comma-separated list of addresses like inbox@example.com")
    return frozenset(emails)


def is_loopback_host(host: str) -> bool:
    """True for `localhost` and loopback IP literals (127.0.0.0/8, ::1), judged on the parsed host."""
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _webhook_url(raw: str, *, allow_insecure: bool) -> str:
    try:
        url = httpx.URL(raw)
    except (httpx.InvalidURL, TypeError, ValueError):
        raise ValueError("an absolute http(s) URL") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError("an absolute http(s) URL")
    if url.port is not None and not 1 <= url.port <= 65535:
        raise ValueError("an absolute http(s) URL with a port 1-65535")
    if url.scheme == "http" and not allow_insecure and not is_loopback_host(url.host):
        raise ValueError(
            "an https URL (plain http is allowed only to loopback hosts unless MAIL_RELAY_WEBHOOK_ALLOW_INSECURE=true)"
        )
    return raw


def _boolean(raw: str) -> bool:
    value = raw.lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError("a boolean (true/false, 1/0, yes/no, on/off)")


def _bind_address(raw: str) -> str:
    try:
        ipaddress.ip_address(raw)
    except ValueError:
        if not _HOSTNAME.match(raw):
            raise ValueError("an IP address or host name to listen on") from None
    return raw


def _integer(raw: str, expected: str, low: int, high: int | None = None) -> int:
    try:
        value = int(raw, 10)
    except ValueError:
        raise ValueError(expected) from None
    if value < low or (high is not None and value > high):
        raise ValueError(expected)
    return value


def _port(raw: str) -> int:
    return _integer(raw, "a TCP port 0-65535", 0, 65535)


def _positive_int(raw: str) -> int:
    return _integer(raw, "a positive integer", 1)


def _non_negative_int(raw: str) -> int:
    return _integer(raw, "an integer >= 0", 0)


def _failure_rate(raw: str) -> float:
    expected = "a failure rate between 0.0 and 1.0"
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(expected) from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(expected)
    return value


def _removed_breaker_threshold(raw: str) -> None:
    raise ValueError(
        "nothing: this variable was removed; the breaker now opens on a failure rate over webhook attempts, "
        "set MAIL_RELAY_CIRCUIT_BREAKER_FAILURE_RATE (0.0-1.0) and MAIL_RELAY_CIRCUIT_BREAKER_MIN_REQUESTS instead"
    )


def _retries(raw: str) -> int:
    return _integer(raw, f"an integer 0-{MAX_WEBHOOK_RETRIES}", 0, MAX_WEBHOOK_RETRIES)


def _seconds(raw: str, expected: str, *, allow_zero: bool) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(expected) from None
    if value != value or value in (float("inf"), float("-inf")) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(expected)
    return value


def _positive_seconds(raw: str) -> float:
    return _seconds(raw, "a number of seconds > 0", allow_zero=False)


def _non_negative_seconds(raw: str) -> float:
    return _seconds(raw, "a number of seconds >= 0", allow_zero=True)


def _prefix_list(raw: str) -> tuple[str, ...]:
    prefixes = tuple(dict.fromkeys(p.strip().lower() for p in raw.split(",") if p.strip()))
    if any(not p.isprintable() or " " in p or ":" in p for p in prefixes):
        raise ValueError("a comma-separated list of header-name prefixes like X-Custom-")
    return prefixes


def _secret(raw: str) -> str:
    if not raw:
        raise ValueError("a non-empty secret (unset the variable to turn signing off)")
    return raw


def _pem_path(raw: str) -> Path:
    path = Path(raw).expanduser()
    if not path.is_file():
        raise ValueError("the path of a readable PEM file")
    return path


def _log_level(raw: str) -> str:
    value = raw.upper()
    if value not in LOG_LEVELS:
        raise ValueError("one of " + ", ".join(LOG_LEVELS))
    return value


def _log_format(raw: str) -> str:
    value = raw.lower()
    if value not in LOG_FORMATS:
        raise ValueError("one of " + ", ".join(LOG_FORMATS))
    return value


def _choice(raw: str, choices: tuple[str, ...]) -> str:
    value = raw.lower()
    if value not in choices:
        raise ValueError("one of " + ", ".join(choices))
    return value


def _dns_servers(raw: str) -> tuple[tuple[str, int], ...]:
    """`ip`, `ip:port`, `[ipv6]:port` or a bare IPv6 address, comma-separated."""
    expected = "a comma-separated list of DNS server addresses like 192.0.2.53, 192.0.2.54:5353 or [2001:db8::53]:53"
    servers: list[tuple[str, int]] = []
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        host, port = item, str(DNS_PORT)
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            if rest:
                if not rest.startswith(":"):
                    raise ValueError(expected)
                port = rest[1:]
        elif item.count(":") == 1:
            host, port = item.split(":")
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(expected) from None
        servers.append((str(address), _integer(port, expected, 1, 65535)))
    if not servers:
        raise ValueError(expected)
    return tuple(dict.fromkeys(servers))


def _mime_types(raw: str) -> tuple[str, ...]:
    types = tuple(dict.fromkeys(t.strip().lower() for t in raw.split(",") if t.strip()))
    if not types or not all(_MIME_PATTERN.match(t) for t in types):
        raise ValueError("a comma-separated list of MIME types like application/pdf, image/*")
    return types


def _extensions(raw: str) -> frozenset[str]:
    extensions = [e.strip().lower().lstrip(".") for e in raw.split(",") if e.strip()]
    if not extensions or not all(_EXTENSION.match(e) for e in extensions):
        raise ValueError("a comma-separated list of file extensions like exe, js, bat")
    return frozenset(extensions)


def _bucket(raw: str) -> str:
    if not _BUCKET.match(raw) or ".." in raw:
        raise ValueError("an S3 bucket name (3-63 characters: lower-case letters, digits, dots, hyphens)")
    return raw


def _key_prefix(raw: str) -> str:
    if not _KEY_PREFIX.match(raw) or raw.startswith("/") or ".." in raw.split("/") or "//" in raw:
        raise ValueError("an S3 key prefix like attachments/ (letters, digits and !_.*'()/-, no leading /)")
    return raw


def _endpoint_url(raw: str) -> str:
    try:
        url = httpx.URL(raw)
    except (httpx.InvalidURL, TypeError, ValueError):
        raise ValueError("an absolute http(s) URL like http://127.0.0.1:9000") from None
    if url.scheme not in ("http", "https") or not url.host or url.query or url.fragment:
        raise ValueError("an absolute http(s) URL like http://127.0.0.1:9000")
    if url.port is not None and not 1 <= url.port <= 65535:
        raise ValueError("an absolute http(s) URL with a port 1-65535")
    return raw


def _region(raw: str) -> str:
    if not _REGION.match(raw):
        raise ValueError("an AWS region name like eu-central-1")
    return raw


def _presign_secs(raw: str) -> int:
    return _integer(raw, f"a number of seconds 1-{MAX_PRESIGN_SECS}", 1, MAX_PRESIGN_SECS)


def _nats_urls(raw: str) -> str:
    """One NATS URL or a comma-separated cluster list: nats://, tls://, ws:// or wss://, each with a host."""
    expected = "a NATS URL like nats://127.0.0.1:4222 (several: comma-separated)"
    urls = [part.strip() for part in raw.split(",")]
    if not all(urls):
        raise ValueError(expected)
    for url in urls:
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, TypeError, ValueError):
            raise ValueError(expected) from None
        if parsed.scheme not in _NATS_SCHEMES or not parsed.host:
            raise ValueError(expected)
        if parsed.port is not None and not 1 <= parsed.port <= 65535:
            raise ValueError(expected)
    return ",".join(urls)


def _stream_name(raw: str) -> str:
    if not _STREAM_NAME.match(raw):
        raise ValueError("a JetStream stream name (1-64 letters, digits, _ and -)")
    return raw


def _queue_attempts(raw: str) -> int:
    return _integer(raw, f"an integer 1-{MAX_QUEUE_ATTEMPTS}", 1, MAX_QUEUE_ATTEMPTS)


def mask_nats_url(url: str) -> str:
    """NATS URLs as shown in errors and logs: a password, a token (``nats://TOKEN@host``) and a query become
    ``***``; comma-separated cluster lists are masked one by one."""
    return mask_url(url, cluster=True)


Port = Annotated[int, _env(_port)]
PositiveInt = Annotated[int, _env(_positive_int)]
PositiveSeconds = Annotated[float, _env(_positive_seconds)]
NonNegativeSeconds = Annotated[float, _env(_non_negative_seconds)]
BindAddress = Annotated[str, _env(_bind_address)]
PemPath = Annotated[Path | None, _env(_pem_path)]
OptionalPositiveInt = Annotated[int | None, _env(_positive_int)]
OptionalNonNegativeInt = Annotated[int | None, _env(_non_negative_int)]
MimeTypes = Annotated[tuple[str, ...], _env(_mime_types)]


class Settings(BaseSettings):
    """Validated relay settings, one attribute per MAIL_RELAY_* variable; see docs/mailrelay.md for each.

    ``Settings()`` reads the process environment over ``./.env`` and raises pydantic's ValidationError;
    :func:`load_settings` and :func:`parse_settings` raise ConfigError instead. Fields are declared in the order
    they are checked: the error names the first bad variable in that order.
    """

    model_config = SettingsConfigDict(
        # MAIL_RELAY_ + the field name in capitals, spelled exactly so: env_prefix alone would match any spelling
        # (pydantic-settings compares lower-cased names unless case_sensitive, and then wants MAIL_RELAY_port).
        alias_generator=AliasGenerator(validation_alias=_variable),
        case_sensitive=True,
        env_file=ENV_FILE,
        env_file_encoding="utf-8",
        enable_decoding=False,  # lists are comma-separated text, not JSON
        extra="ignore",
        frozen=True,
    )

    tls_cert: PemPath = None
    tls_key: PemPath = Field(default=None, validate_default=True)
    webhook_allow_insecure: Annotated[bool, _env(_boolean)] = False
    target_emails: Annotated[frozenset[str], _env(_email_list, required=True)]
    webhook_url: str
    bind_address: BindAddress = "0.0.0.0"
    port: Port = DEFAULT_PORT
    health_bind_address: BindAddress = "0.0.0.0"
    health_port: Port = DEFAULT_HEALTH_PORT
    # Prometheus metrics (docs/mailrelay.md "Metrics"): unset, nothing listens and nothing is recorded. On the
    # health endpoint's address, since both are for the operator and not for mail senders.
    metrics_port: Annotated[int | None, _env(_port)] = None
    header_prefixes: Annotated[tuple[str, ...], _env(_prefix_list)] = Field(
        default=(), validation_alias=PREFIX + "HEADER_PREFIX"
    )
    webhook_signing_secret: Annotated[str | None, _env(_secret, secret=True)] = Field(default=None, repr=False)
    webhook_timeout: PositiveSeconds = DEFAULT_WEBHOOK_TIMEOUT_SECS
    webhook_max_retries: Annotated[int, _env(_retries)] = DEFAULT_WEBHOOK_MAX_RETRIES
    webhook_backoff_base: NonNegativeSeconds = DEFAULT_WEBHOOK_BACKOFF_BASE_SECS
    # The webhook's circuit breaker (bastion_core.CircuitBreaker: the spec's rate over a sliding window).
    circuit_breaker_failure_rate: Annotated[float, _env(_failure_rate)] = DEFAULT_BREAKER_FAILURE_RATE
    circuit_breaker_min_requests: PositiveInt = DEFAULT_BREAKER_MIN_REQUESTS
    circuit_breaker_half_open_requests: PositiveInt = DEFAULT_BREAKER_HALF_OPEN_REQUESTS
    circuit_breaker_reset: PositiveSeconds = DEFAULT_BREAKER_RESET_SECS
    circuit_breaker_threshold: Annotated[None, _env(_removed_breaker_threshold)] = None
    max_message_size: PositiveInt = DEFAULT_MAX_MESSAGE_SIZE
    max_attachment_size: PositiveInt = DEFAULT_MAX_ATTACHMENT_SIZE
    log_level: Annotated[str, _env(_log_level)] = "INFO"
    log_format: Annotated[LogFormat, _env(_log_format)] = "auto"
    # A MAIL_RELAY_* name no setting reads is a typo until the operator says otherwise (docs/mailrelay.md).
    ignore_unknown_variables: Annotated[bool, _env(_boolean)] = False
    max_concurrent_per_ip: PositiveInt = DEFAULT_MAX_CONCURRENT_PER_IP
    max_sessions: PositiveInt = DEFAULT_MAX_SESSIONS
    max_unknown_rcpts_per_session: Annotated[int, _env(_non_negative_int)] = DEFAULT_MAX_UNKNOWN_RCPTS
    idle_timeout: PositiveSeconds = DEFAULT_IDLE_TIMEOUT_SECS
    shutdown_grace: NonNegativeSeconds = DEFAULT_SHUTDOWN_GRACE_SECS
    # DMARC (docs/mailrelay.md "DMARC")
    dmarc_mode: Annotated[DmarcMode, _env(lambda raw: _choice(raw, DMARC_MODES))] = "off"
    dns_servers: Annotated[tuple[tuple[str, int], ...], _env(_dns_servers)] = ()
    dns_timeout: PositiveSeconds = DEFAULT_DNS_TIMEOUT_SECS
    # The attachment policy. ATTACHMENT_MAX_BYTES is the per-attachment limit MAX_ATTACHMENT_SIZE (above) always was:
    # either name sets it, both at once is an error, and both attributes always hold the limit in force.
    attachment_max_bytes: PositiveInt = DEFAULT_MAX_ATTACHMENT_SIZE
    attachment_max_total_bytes: OptionalPositiveInt = None
    attachment_max_count: OptionalNonNegativeInt = None
    attachment_allowed_types: MimeTypes = ()
    attachment_denied_types: MimeTypes = ()
    attachment_denied_extensions: Annotated[frozenset[str], _env(_extensions)] = frozenset()
    attachment_policy_action: Annotated[PolicyAction, _env(lambda raw: _choice(raw, POLICY_ACTIONS))] = "drop"
    # Attachment delivery: inline base64, or S3 (credentials from the standard AWS chain, never from MAIL_RELAY_*)
    attachment_delivery: Annotated[AttachmentDelivery, _env(lambda raw: _choice(raw, ATTACHMENT_DELIVERIES))] = "inline"
    s3_bucket: Annotated[str | None, _env(_bucket)] = Field(default=None, validate_default=True)
    s3_prefix: Annotated[str, BeforeValidator(lambda raw: _read(raw, _key_prefix) if raw != "" else raw)] = ""
    s3_endpoint_url: Annotated[str | None, _env(_endpoint_url)] = None
    s3_region: Annotated[str | None, _env(_region)] = None
    s3_presign_secs: Annotated[int | None, _env(_presign_secs)] = None
    s3_inline_max_bytes: OptionalNonNegativeInt = None
    s3_timeout: PositiveSeconds = DEFAULT_S3_TIMEOUT_SECS
    # Queue mode (docs/mailrelay.md "Queue mode"): 250 once JetStream stored the message; workers POST it.
    queue: Annotated[QueueMode, _env(lambda raw: _choice(raw, QUEUE_MODES))] = "direct"
    nats_url: Annotated[str | None, _env(_nats_urls)] = Field(default=None, validate_default=True)
    queue_stream: Annotated[str, _env(_stream_name)] = DEFAULT_QUEUE_STREAM
    queue_workers: Annotated[int, _env(_non_negative_int)] = DEFAULT_QUEUE_WORKERS
    queue_max_attempts: Annotated[int, _env(_queue_attempts)] = DEFAULT_QUEUE_MAX_ATTEMPTS
    queue_max_age: PositiveSeconds = DEFAULT_QUEUE_MAX_AGE_SECS
    queue_ack_wait: PositiveSeconds = Field(default=DEFAULT_QUEUE_ACK_WAIT_SECS, validate_default=True)

    @field_validator("tls_key")
    @classmethod
    def _check_tls_pair(cls, key: Path | None, info: ValidationInfo) -> Path | None:
        if "tls_cert" not in info.data:  # the certificate itself is bad, and that is reported first
            return key
        if (info.data["tls_cert"] is None) != (key is None):
            missing = "TLS_KEY" if key is None else "TLS_CERT"
            raise ConfigError.invalid(PREFIX + missing, None, "a PEM path (TLS_CERT and TLS_KEY are set together)")
        return key

    @field_validator("metrics_port")
    @classmethod
    def _check_metrics_port(cls, port: int | None, info: ValidationInfo) -> int | None:
        """A port of its own: the health server shares its address, and SMTP may too (0, a random port, never
        clashes)."""
        if not port:
            return port
        for variable, taken in (("PORT", info.data.get("port")), ("HEALTH_PORT", info.data.get("health_port"))):
            if port == taken:
                raise ConfigError.invalid(
                    PREFIX + "METRICS_PORT", str(port), f"a TCP port other than {PREFIX}{variable} ({taken})"
                )
        return port

    @field_validator("webhook_url", mode="before")
    @classmethod
    def _check_webhook_url(cls, raw: object, info: ValidationInfo) -> object:
        allow_insecure = bool(info.data.get("webhook_allow_insecure", False))
        return _read(raw, lambda value: _webhook_url(value, allow_insecure=allow_insecure), required=True)

    @field_validator("s3_bucket")
    @classmethod
    def _check_bucket_for_s3(cls, bucket: str | None, info: ValidationInfo) -> str | None:
        if bucket is None and info.data.get("attachment_delivery") == "s3":
            raise ConfigError.invalid(
                PREFIX + "S3_BUCKET", None, "an S3 bucket name (required with MAIL_RELAY_ATTACHMENT_DELIVERY=s3)"
            )
        return bucket

    @field_validator("nats_url")
    @classmethod
    def _check_nats_url_for_queue(cls, url: str | None, info: ValidationInfo) -> str | None:
        if url is None and info.data.get("queue") == "jetstream":
            raise ConfigError.invalid(
                PREFIX + "NATS_URL",
                None,
                "a NATS URL like nats://127.0.0.1:4222 (required with MAIL_RELAY_QUEUE=jetstream)",
            )
        return url

    @field_validator("queue_ack_wait")
    @classmethod
    def _check_ack_wait(cls, ack_wait: float, info: ValidationInfo) -> float:
        """A delivery still waiting for the webhook must not be handed to another worker: the wait outlasts it."""
        timeout = info.data.get("webhook_timeout")
        if info.data.get("queue") == "jetstream" and timeout is not None and ack_wait <= timeout:
            raise ConfigError.invalid(
                PREFIX + "QUEUE_ACK_WAIT",
                f"{ack_wait:g}",
                f"a number of seconds greater than MAIL_RELAY_WEBHOOK_TIMEOUT ({timeout:g})",
            )
        return ack_wait

    @model_validator(mode="after")
    def _one_attachment_limit(self) -> Settings:
        """MAX_ATTACHMENT_SIZE (the old name) and ATTACHMENT_MAX_BYTES set the same limit: one of them at most."""
        old, new = "max_attachment_size", "attachment_max_bytes"
        if old in self.model_fields_set and new in self.model_fields_set:
            raise ConfigError.invalid(
                PREFIX + old.upper(),
                str(self.max_attachment_size),
                f"no value when {PREFIX}{new.upper()} is set (it is the old name of the same limit)",
            )
        # frozen model: the two attributes are made equal once, here, while it is being built
        if old in self.model_fields_set:
            object.__setattr__(self, new, self.max_attachment_size)
        else:
            object.__setattr__(self, old, self.attachment_max_bytes)
        return self

    @property
    def log_level_number(self) -> int:
        return logging.getLevelNamesMapping()[self.log_level]


class _GivenSettings(Settings):
    """Settings from the given values alone, for parse_settings: no process environment, no `.env`."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


VARIABLES = frozenset(str(field.validation_alias) for field in Settings.model_fields.values())
"""Every MAIL_RELAY_* name a setting reads."""
REMOVED_VARIABLES = frozenset({PREFIX + "CIRCUIT_BREAKER_THRESHOLD"})
"""Names still read only to say what replaced them."""


def load_settings(cwd: Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Read the process environment over `<cwd>/.env` (a variable set in both keeps the process value) and validate.

    `environ` stands in for the process environment (tests). Raises ConfigError naming the first bad variable and
    its value (URL passwords and queries masked, the signing secret never shown).
    """
    if environ is not None:
        return parse_settings(read_environment(cwd, environ))
    try:
        # mypy sees pydantic's __init__ with one parameter per field; BaseSettings' own takes _env_file and reads
        # the fields from the environment and that file
        return Settings(_env_file=(cwd or Path.cwd()) / ENV_FILE)  # type: ignore[call-arg]
    except ValidationError as exc:
        raise _config_error(exc) from None


def parse_settings(environ: Mapping[str, str]) -> Settings:
    """Validate MAIL_RELAY_* values from a plain mapping; pure, so tests need no environment."""
    values = {name: value for name, value in environ.items() if name in VARIABLES}
    try:
        # text for every field, which its converter turns into the field's type (mypy expects the typed values)
        given = _GivenSettings(**values)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise _config_error(exc) from None
    # validated values, handed over as the one public class (already checked: no second validation)
    return Settings.model_construct(_fields_set=given.model_fields_set, **dict(given))


def read_environment(cwd: Path | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`<cwd>/.env` merged under the process environment (or `environ`): the names and values Settings() sees."""
    env_file = (cwd or Path.cwd()) / ENV_FILE
    merged: dict[str, str] = {}
    if env_file.is_file():
        merged.update({k: v for k, v in dotenv_values(env_file, encoding="utf-8").items() if v is not None})
    merged.update(os.environ if environ is None else environ)
    return merged


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """MAIL_RELAY_* names that no setting reads (most likely typos), sorted."""
    return sorted(name for name in environ if name.startswith(PREFIX) and name not in VARIABLES)


def refuse_unknown_variables(names: Sequence[str]) -> None:
    """Raise ConfigError for the first of ``names`` (unknown MAIL_RELAY_* variables), with the known name closest
    to it and the way to start anyway. A misspelled variable is a setting silently left at its default: the
    relay would start and do something else than the operator asked for."""
    if not names:
        return
    name = names[0]
    # compared without the shared prefix, which would make every name look close to every other
    known = sorted(variable.removeprefix(PREFIX) for variable in VARIABLES - REMOVED_VARIABLES)
    close = difflib.get_close_matches(name.removeprefix(PREFIX), known, n=1, cutoff=0.7)
    hint = f" (did you mean {PREFIX}{close[0]}?)" if close else ""
    more = f" ({len(names) - 1} more unknown)" if len(names) > 1 else ""
    raise ConfigError(
        f"{name}: not a MailRelay variable{hint}{more}; fix the name, or set {PREFIX}IGNORE_UNKNOWN_VARIABLES=true "
        "to start anyway"
    )


def variable_defaults() -> list[tuple[str, str]]:
    """``(variable, default as text)`` for every setting, in the order they are checked (``mailrelay --help``)."""
    listed = []
    for field in Settings.model_fields.values():
        name = str(field.validation_alias)
        if name in REMOVED_VARIABLES:
            continue
        default = field.default
        if field.is_required():
            shown = "required"
        elif default is None:
            shown = "unset"
        elif isinstance(default, bool):
            shown = str(default).lower()
        elif isinstance(default, (str, tuple, frozenset)) and not default:
            shown = "empty"
        elif isinstance(default, (tuple, frozenset)):
            shown = ",".join(sorted(str(item) for item in default))
        else:
            shown = str(default)
        listed.append((name, shown))
    return listed


def shown_value(raw: str) -> str:
    """A setting's value as an error may show it: a URL's userinfo password and query masked with ``***``."""
    return mask_url(raw)


def _config_error(error: ValidationError) -> ConfigError:
    """The first problem pydantic found (in field order), as the ConfigError naming variable, expectation, value."""
    problem = error.errors(include_url=False)[0]
    cause = problem.get("ctx", {}).get("error")
    if isinstance(cause, ConfigError):
        return cause
    variable = str(problem["loc"][0])
    if problem["type"] == "missing":
        return ConfigError.invalid(variable, None, _REQUIRED)
    if variable in _SECRETS:
        shown = REDACTED
    elif variable == PREFIX + "NATS_URL":
        shown = mask_nats_url(str(problem["input"]))
    else:
        shown = shown_value(str(problem["input"]))
    return ConfigError.invalid(variable, shown, str(cause) if cause is not None else problem["msg"])
