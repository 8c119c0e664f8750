"""MAIL_RELAY_* settings: a pydantic-settings model over the environment and `./.env`, validated once at start-up,
and the ways to load it (each error a ConfigError naming the variable). The converters are in `converters.py`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

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
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from bastion_core import ConfigError, mask_url
from mailrelay._config.converters import (
    ATTACHMENT_DELIVERIES,
    DMARC_MODES,
    POLICY_ACTIONS,
    PREFIX,
    QUEUE_MODES,
    RAW_MODES,
    REDACTED,
    REQUIRED,
    SECRETS,
    AttachmentDelivery,
    BindAddress,
    DmarcMode,
    LogFormat,
    MimeTypes,
    NonNegativeSeconds,
    OptionalNonNegativeInt,
    OptionalPositiveInt,
    PemPath,
    PolicyAction,
    Port,
    PositiveInt,
    PositiveSeconds,
    QueueMode,
    RawMode,
    check_target_patterns,
    env,
    mask_nats_url,
    parse_boolean,
    parse_bucket,
    parse_choice,
    parse_dns_servers,
    parse_email_list,
    parse_endpoint_url,
    parse_extensions,
    parse_failure_rate,
    parse_key_prefix,
    parse_log_format,
    parse_log_level,
    parse_nats_urls,
    parse_non_negative_int,
    parse_payload_version,
    parse_prefix_list,
    parse_presign_secs,
    parse_queue_attempts,
    parse_region,
    parse_removed_breaker_threshold,
    parse_retries,
    parse_routes_file,
    parse_secret,
    parse_sender_policy_text,
    parse_stream_name,
    parse_tcp_port,
    parse_webhook_url,
    read_variable,
    variable_name,
)
from mailrelay.smtp._replies import DEFAULT_SENDER_POLICY_TEXT

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
DEFAULT_TLS_RELOAD_INTERVAL_SECS = 10.0
DEFAULT_DNS_TIMEOUT_SECS = 5.0  # per DNS query; RFC 7208 4.6.4 suggests 20 s for a whole SPF check
DEFAULT_S3_TIMEOUT_SECS = 30.0
DEFAULT_QUEUE_STREAM = "MAILRELAY"
DEFAULT_QUEUE_WORKERS = 16
DEFAULT_QUEUE_MAX_ATTEMPTS = 25
DEFAULT_QUEUE_MAX_AGE_SECS = 86_400.0  # a day; the sending server's own queue would have kept it ~5 days
DEFAULT_QUEUE_ACK_WAIT_SECS = 60.0
DEFAULT_RAW_INLINE_MAX_BYTES = 524_288  # 683 KiB of base64: the payload still fits NATS' default 1 MB message


class Settings(BaseSettings):
    """Validated relay settings, one attribute per MAIL_RELAY_* variable; see docs/mailrelay.md for each.

    ``Settings()`` reads the process environment over ``./.env`` and raises pydantic's ValidationError;
    :func:`load_settings` and :func:`parse_settings` raise ConfigError instead. Fields are declared in the order
    they are checked: the error names the first bad variable in that order.
    """

    model_config = SettingsConfigDict(
        # MAIL_RELAY_ + the field name in capitals, spelled exactly so: env_prefix alone would match any spelling
        # (pydantic-settings compares lower-cased names unless case_sensitive, and then wants MAIL_RELAY_port).
        alias_generator=AliasGenerator(validation_alias=variable_name),
        case_sensitive=True,
        env_file=ENV_FILE,
        env_file_encoding="utf-8",
        enable_decoding=False,  # lists are comma-separated text, not JSON
        extra="ignore",
        frozen=True,
    )

    tls_cert: PemPath = None
    tls_key: PemPath = Field(default=None, validate_default=True)
    tls_reload_interval: PositiveSeconds = DEFAULT_TLS_RELOAD_INTERVAL_SECS
    webhook_allow_insecure: Annotated[bool, env(parse_boolean)] = False
    # Recipient routing (docs/mailrelay.md "Recipient routing"): the routes file, then the default route's pair.
    strip_recipient_tag: Annotated[bool, env(parse_boolean)] = False
    routes_file: Annotated[Path | None, env(parse_routes_file)] = None
    target_emails: Annotated[frozenset[str], env(parse_email_list)] = Field(default=frozenset(), validate_default=True)
    webhook_url: str | None = Field(default=None, validate_default=True)
    bind_address: BindAddress = "0.0.0.0"
    port: Port = DEFAULT_PORT
    health_bind_address: BindAddress = "0.0.0.0"
    health_port: Port = DEFAULT_HEALTH_PORT
    # Prometheus metrics (docs/mailrelay.md "Metrics"): unset, nothing listens and nothing is recorded. On the
    # health endpoint's address, since both are for the operator and not for mail senders.
    metrics_port: Annotated[int | None, env(parse_tcp_port)] = None
    header_prefixes: Annotated[tuple[str, ...], env(parse_prefix_list)] = Field(
        default=(), validation_alias=PREFIX + "HEADER_PREFIX"
    )
    # 1: the specification's payload, byte for byte; 2: its fields and more (docs/mailrelay.md "Payload v2")
    payload_version: Annotated[int, env(parse_payload_version)] = 1
    webhook_signing_secret: Annotated[str | None, env(parse_secret, secret=True)] = Field(default=None, repr=False)
    webhook_timeout: PositiveSeconds = DEFAULT_WEBHOOK_TIMEOUT_SECS
    webhook_max_retries: Annotated[int, env(parse_retries)] = DEFAULT_WEBHOOK_MAX_RETRIES
    webhook_backoff_base: NonNegativeSeconds = DEFAULT_WEBHOOK_BACKOFF_BASE_SECS
    # The webhook's circuit breaker (bastion_core.CircuitBreaker: the spec's rate over a sliding window).
    circuit_breaker_failure_rate: Annotated[float, env(parse_failure_rate)] = DEFAULT_BREAKER_FAILURE_RATE
    circuit_breaker_min_requests: PositiveInt = DEFAULT_BREAKER_MIN_REQUESTS
    circuit_breaker_half_open_requests: PositiveInt = DEFAULT_BREAKER_HALF_OPEN_REQUESTS
    circuit_breaker_reset: PositiveSeconds = DEFAULT_BREAKER_RESET_SECS
    circuit_breaker_threshold: Annotated[None, env(parse_removed_breaker_threshold)] = None
    max_message_size: PositiveInt = DEFAULT_MAX_MESSAGE_SIZE
    max_attachment_size: PositiveInt = DEFAULT_MAX_ATTACHMENT_SIZE
    log_level: Annotated[str, env(parse_log_level)] = "INFO"
    log_format: Annotated[LogFormat, env(parse_log_format)] = "auto"
    # A MAIL_RELAY_* name no setting reads is a typo until the operator says otherwise (docs/mailrelay.md).
    ignore_unknown_variables: Annotated[bool, env(parse_boolean)] = False
    max_concurrent_per_ip: PositiveInt = DEFAULT_MAX_CONCURRENT_PER_IP
    max_sessions: PositiveInt = DEFAULT_MAX_SESSIONS
    max_unknown_rcpts_per_session: Annotated[int, env(parse_non_negative_int)] = DEFAULT_MAX_UNKNOWN_RCPTS
    idle_timeout: PositiveSeconds = DEFAULT_IDLE_TIMEOUT_SECS
    shutdown_grace: NonNegativeSeconds = DEFAULT_SHUTDOWN_GRACE_SECS
    # DMARC (docs/mailrelay.md "DMARC")
    dmarc_mode: Annotated[DmarcMode, env(lambda raw: parse_choice(raw, DMARC_MODES))] = "off"
    dns_servers: Annotated[tuple[tuple[str, int], ...], env(parse_dns_servers)] = ()
    dns_timeout: PositiveSeconds = DEFAULT_DNS_TIMEOUT_SECS
    # The attachment policy. ATTACHMENT_MAX_BYTES is the per-attachment limit MAX_ATTACHMENT_SIZE (above) always was:
    # either name sets it, both at once is an error, and both attributes always hold the limit in force.
    attachment_max_bytes: PositiveInt = DEFAULT_MAX_ATTACHMENT_SIZE
    attachment_max_total_bytes: OptionalPositiveInt = None
    attachment_max_count: OptionalNonNegativeInt = None
    attachment_allowed_types: MimeTypes = ()
    attachment_denied_types: MimeTypes = ()
    attachment_denied_extensions: Annotated[frozenset[str], env(parse_extensions)] = frozenset()
    attachment_policy_action: Annotated[PolicyAction, env(lambda raw: parse_choice(raw, POLICY_ACTIONS))] = "drop"
    # Attachment delivery: inline base64, or S3 (credentials from the standard AWS chain, never from MAIL_RELAY_*)
    attachment_delivery: Annotated[AttachmentDelivery, env(lambda raw: parse_choice(raw, ATTACHMENT_DELIVERIES))] = (
        "inline"
    )
    # The original message (docs/mailrelay.md "Raw message"): off, an .eml object in S3, or base64 in the payload.
    raw: Annotated[RawMode, env(lambda raw: parse_choice(raw, RAW_MODES))] = "off"
    raw_inline_max_bytes: PositiveInt = DEFAULT_RAW_INLINE_MAX_BYTES
    s3_bucket: Annotated[str | None, env(parse_bucket)] = Field(default=None, validate_default=True)
    s3_prefix: Annotated[
        str, BeforeValidator(lambda raw: read_variable(raw, parse_key_prefix) if raw != "" else raw)
    ] = ""
    s3_endpoint_url: Annotated[str | None, env(parse_endpoint_url)] = None
    s3_region: Annotated[str | None, env(parse_region)] = None
    s3_presign_secs: Annotated[int | None, env(parse_presign_secs)] = None
    s3_inline_max_bytes: OptionalNonNegativeInt = None
    s3_timeout: PositiveSeconds = DEFAULT_S3_TIMEOUT_SECS
    # Queue mode (docs/mailrelay.md "Queue mode"): 250 once JetStream stored the message; workers POST it.
    queue: Annotated[QueueMode, env(lambda raw: parse_choice(raw, QUEUE_MODES))] = "direct"
    nats_url: Annotated[str | None, env(parse_nats_urls)] = Field(default=None, validate_default=True)
    queue_stream: Annotated[str, env(parse_stream_name)] = DEFAULT_QUEUE_STREAM
    queue_workers: Annotated[int, env(parse_non_negative_int)] = DEFAULT_QUEUE_WORKERS
    queue_max_attempts: Annotated[int, env(parse_queue_attempts)] = DEFAULT_QUEUE_MAX_ATTEMPTS
    queue_max_age: PositiveSeconds = DEFAULT_QUEUE_MAX_AGE_SECS
    queue_ack_wait: PositiveSeconds = Field(default=DEFAULT_QUEUE_ACK_WAIT_SECS, validate_default=True)
    # Sender rules (docs/mailrelay.md "Sender rules"): a Cedar policy per message; its Deny answers 550 5.7.1.
    sender_policy_file: Annotated[Path | None, env(parse_routes_file)] = None
    sender_policy_deny_text: Annotated[str, env(parse_sender_policy_text)] = DEFAULT_SENDER_POLICY_TEXT

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

    @field_validator("target_emails", mode="before")
    @classmethod
    def _blank_targets(cls, raw: object, info: ValidationInfo) -> object:
        """A blank value is missing, and shown as given, when there is no routes file to take its place."""
        if isinstance(raw, str) and not raw.strip() and info.data.get("routes_file") is None:
            raise ValueError(REQUIRED)
        return raw

    @field_validator("target_emails")
    @classmethod
    def _check_targets(cls, targets: frozenset[str], info: ValidationInfo) -> frozenset[str]:
        """Each a pattern that can match (exact, *@domain, user+*@domain); required without a routes file."""
        strip_tag = bool(info.data.get("strip_recipient_tag", False))
        return check_target_patterns(targets, strip_tag=strip_tag, required=info.data.get("routes_file") is None)

    @field_validator("webhook_url", mode="before")
    @classmethod
    def _check_webhook_url(cls, raw: object, info: ValidationInfo) -> object:
        """Required with MAIL_RELAY_TARGET_EMAILS (the default route), which is required without a routes file."""
        allow_insecure = bool(info.data.get("webhook_allow_insecure", False))
        required = bool(info.data.get("target_emails")) or info.data.get("routes_file") is None
        if raw is None:
            if required:
                raise ConfigError.invalid(PREFIX + "WEBHOOK_URL", None, REQUIRED)
            return None
        return read_variable(
            raw, lambda value: parse_webhook_url(value, allow_insecure=allow_insecure), required=required
        )

    @field_validator("s3_bucket")
    @classmethod
    def _check_bucket_for_s3(cls, bucket: str | None, info: ValidationInfo) -> str | None:
        for variable in ("attachment_delivery", "raw"):
            if bucket is None and info.data.get(variable) == "s3":
                raise ConfigError.invalid(
                    PREFIX + "S3_BUCKET", None, f"an S3 bucket name (required with {PREFIX}{variable.upper()}=s3)"
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


REQUIRED_WITHOUT_ROUTES_FILE = ("target_emails", "webhook_url")
"""Required unless MAIL_RELAY_ROUTES_FILE is set (`mailrelay --help` lists them as required)."""
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
        return ConfigError.invalid(variable, None, REQUIRED)
    if variable in SECRETS:
        shown = REDACTED
    elif variable == PREFIX + "NATS_URL":
        shown = mask_nats_url(str(problem["input"]))
    else:
        shown = shown_value(str(problem["input"]))
    return ConfigError.invalid(variable, shown, str(cause) if cause is not None else problem["msg"])
