"""MAIL_RELAY_* settings: read from the environment and a `.env` file, validated once at start-up."""

from __future__ import annotations

import ipaddress
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx
from dotenv import dotenv_values

from mailrelay.errors import ConfigError

PREFIX = "MAIL_RELAY_"
DEFAULT_PORT = 2525
DEFAULT_HEALTH_PORT = 8080
DEFAULT_WEBHOOK_TIMEOUT_SECS = 30.0
DEFAULT_WEBHOOK_MAX_RETRIES = 3
DEFAULT_WEBHOOK_BACKOFF_BASE_SECS = 1.0
DEFAULT_BREAKER_THRESHOLD = 5
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
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})
_EMAIL = re.compile(r"^[^@\s,<>]+@[^@\s,<>]+$")
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$")
_SECRET_NAMES = frozenset({"WEBHOOK_SIGNING_SECRET"})

KNOWN_NAMES = frozenset(
    {
        "TARGET_EMAILS",
        "WEBHOOK_URL",
        "WEBHOOK_ALLOW_INSECURE",
        "BIND_ADDRESS",
        "PORT",
        "HEALTH_BIND_ADDRESS",
        "HEALTH_PORT",
        "HEADER_PREFIX",
        "WEBHOOK_SIGNING_SECRET",
        "WEBHOOK_TIMEOUT",
        "WEBHOOK_MAX_RETRIES",
        "WEBHOOK_BACKOFF_BASE",
        "CIRCUIT_BREAKER_THRESHOLD",
        "CIRCUIT_BREAKER_RESET",
        "MAX_MESSAGE_SIZE",
        "MAX_ATTACHMENT_SIZE",
        "TLS_CERT",
        "TLS_KEY",
        "LOG_LEVEL",
        "MAX_CONCURRENT_PER_IP",
        "MAX_SESSIONS",
        "MAX_UNKNOWN_RCPTS_PER_SESSION",
        "IDLE_TIMEOUT",
        "SHUTDOWN_GRACE",
    }
)

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Validated relay settings; see docs/mailrelay.md for each variable."""

    target_emails: frozenset[str]
    webhook_url: str
    webhook_allow_insecure: bool = False
    bind_address: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    health_bind_address: str = "0.0.0.0"
    health_port: int = DEFAULT_HEALTH_PORT
    header_prefixes: tuple[str, ...] = ()
    webhook_signing_secret: str | None = field(default=None, repr=False)
    webhook_timeout: float = DEFAULT_WEBHOOK_TIMEOUT_SECS
    webhook_max_retries: int = DEFAULT_WEBHOOK_MAX_RETRIES
    webhook_backoff_base: float = DEFAULT_WEBHOOK_BACKOFF_BASE_SECS
    circuit_breaker_threshold: int = DEFAULT_BREAKER_THRESHOLD
    circuit_breaker_reset: float = DEFAULT_BREAKER_RESET_SECS
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    max_attachment_size: int = DEFAULT_MAX_ATTACHMENT_SIZE
    tls_cert: Path | None = None
    tls_key: Path | None = None
    log_level: str = "INFO"
    max_concurrent_per_ip: int = DEFAULT_MAX_CONCURRENT_PER_IP
    max_sessions: int = DEFAULT_MAX_SESSIONS
    max_unknown_rcpts_per_session: int = DEFAULT_MAX_UNKNOWN_RCPTS
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT_SECS
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE_SECS

    @property
    def log_level_number(self) -> int:
        return logging.getLevelNamesMapping()[self.log_level]


def read_environment(cwd: Path | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`<cwd>/.env` merged under the process environment: a variable set in both keeps the process value."""
    env_file = (cwd or Path.cwd()) / ".env"
    merged: dict[str, str] = {}
    if env_file.is_file():
        merged.update({k: v for k, v in dotenv_values(env_file).items() if v is not None})
    merged.update(os.environ if environ is None else environ)
    return merged


def load_settings(cwd: Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Read the environment and `.env` (see read_environment) and validate.

    Raises ConfigError naming the first bad variable and its value (the signing secret is never shown).
    """
    return parse_settings(read_environment(cwd, environ))


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """MAIL_RELAY_* names that no setting reads (most likely typos), sorted."""
    return sorted(k for k in environ if k.startswith(PREFIX) and k[len(PREFIX) :] not in KNOWN_NAMES)


def parse_settings(environ: Mapping[str, str]) -> Settings:
    """Validate MAIL_RELAY_* values from a plain mapping; pure, so tests need no environment."""
    reader = _Reader(environ)
    tls_cert = reader.get("TLS_CERT", None, _path)
    tls_key = reader.get("TLS_KEY", None, _path)
    if (tls_cert is None) != (tls_key is None):
        missing = "TLS_KEY" if tls_key is None else "TLS_CERT"
        raise ConfigError(PREFIX + missing, None, "a PEM path (TLS_CERT and TLS_KEY are set together)")
    allow_insecure = reader.get("WEBHOOK_ALLOW_INSECURE", False, _boolean)
    return Settings(
        target_emails=reader.required("TARGET_EMAILS", _email_list),
        webhook_url=reader.required("WEBHOOK_URL", lambda v: _webhook_url(v, allow_insecure=allow_insecure)),
        webhook_allow_insecure=allow_insecure,
        bind_address=reader.get("BIND_ADDRESS", "0.0.0.0", _bind_address),
        port=reader.get("PORT", DEFAULT_PORT, _port),
        health_bind_address=reader.get("HEALTH_BIND_ADDRESS", "0.0.0.0", _bind_address),
        health_port=reader.get("HEALTH_PORT", DEFAULT_HEALTH_PORT, _port),
        header_prefixes=reader.get("HEADER_PREFIX", (), _prefix_list),
        webhook_signing_secret=reader.get("WEBHOOK_SIGNING_SECRET", None, _secret),
        webhook_timeout=reader.get("WEBHOOK_TIMEOUT", DEFAULT_WEBHOOK_TIMEOUT_SECS, _positive_float),
        webhook_max_retries=reader.get("WEBHOOK_MAX_RETRIES", DEFAULT_WEBHOOK_MAX_RETRIES, _retries),
        webhook_backoff_base=reader.get("WEBHOOK_BACKOFF_BASE", DEFAULT_WEBHOOK_BACKOFF_BASE_SECS, _non_negative_float),
        circuit_breaker_threshold=reader.get("CIRCUIT_BREAKER_THRESHOLD", DEFAULT_BREAKER_THRESHOLD, _positive_int),
        circuit_breaker_reset=reader.get("CIRCUIT_BREAKER_RESET", DEFAULT_BREAKER_RESET_SECS, _positive_float),
        max_message_size=reader.get("MAX_MESSAGE_SIZE", DEFAULT_MAX_MESSAGE_SIZE, _positive_int),
        max_attachment_size=reader.get("MAX_ATTACHMENT_SIZE", DEFAULT_MAX_ATTACHMENT_SIZE, _positive_int),
        tls_cert=tls_cert,
        tls_key=tls_key,
        log_level=reader.get("LOG_LEVEL", "INFO", _log_level),
        max_concurrent_per_ip=reader.get("MAX_CONCURRENT_PER_IP", DEFAULT_MAX_CONCURRENT_PER_IP, _positive_int),
        max_sessions=reader.get("MAX_SESSIONS", DEFAULT_MAX_SESSIONS, _positive_int),
        max_unknown_rcpts_per_session=reader.get(
            "MAX_UNKNOWN_RCPTS_PER_SESSION", DEFAULT_MAX_UNKNOWN_RCPTS, _non_negative_int
        ),
        idle_timeout=reader.get("IDLE_TIMEOUT", DEFAULT_IDLE_TIMEOUT_SECS, _positive_float),
        shutdown_grace=reader.get("SHUTDOWN_GRACE", DEFAULT_SHUTDOWN_GRACE_SECS, _non_negative_float),
    )


class _Invalid(ValueError):
    """A converter's complaint: what it expected."""


class _Reader:
    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ

    def required(self, name: str, convert: Callable[[str], T]) -> T:
        raw = self.environ.get(PREFIX + name)
        if raw is None or not raw.strip():
            raise ConfigError(PREFIX + name, raw, "a value (this variable is required)")
        return self._convert(name, raw, convert)

    def get(self, name: str, default: T, convert: Callable[[str], T]) -> T:
        raw = self.environ.get(PREFIX + name)
        if raw is None or (not raw.strip() and name not in _SECRET_NAMES):
            return default
        return self._convert(name, raw, convert)

    def _convert(self, name: str, raw: str, convert: Callable[[str], T]) -> T:
        try:
            return convert(raw if name in _SECRET_NAMES else raw.strip())
        except _Invalid as exc:
            shown = "<redacted>" if name in _SECRET_NAMES else _without_password(raw)
            raise ConfigError(PREFIX + name, shown, str(exc)) from None


_URL_PASSWORD = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/@:]*:)[^/@]*@")


def _without_password(raw: str) -> str:
    """A URL's userinfo password and query are secrets too: `https://user:pw@host/x?token=t` is shown as
    `https://user:***@host/x?***`."""
    shown = _URL_PASSWORD.sub(r"\g<head>***@", raw)
    return shown.split("?", 1)[0] + "?***" if "?" in shown else shown


def _email_list(raw: str) -> frozenset[str]:
    emails = [part.strip().lower() for part in raw.split(",") if part.strip()]
    bad = [e for e in emails if not _EMAIL.match(e)]
    if not emails or bad:
        raise _Invalid("a comma-separated list of addresses like inbox@example.com")
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
        raise _Invalid("an absolute http(s) URL") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise _Invalid("an absolute http(s) URL")
    if url.port is not None and not 1 <= url.port <= 65535:
        raise _Invalid("an absolute http(s) URL with a port 1-65535")
    if url.scheme == "http" and not allow_insecure and not is_loopback_host(url.host):
        raise _Invalid(
            "an https URL (plain http is allowed only to loopback hosts unless MAIL_RELAY_WEBHOOK_ALLOW_INSECURE=true)"
        )
    return raw


def _boolean(raw: str) -> bool:
    value = raw.lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise _Invalid("a boolean (true/false, 1/0, yes/no, on/off)")


def _bind_address(raw: str) -> str:
    try:
        ipaddress.ip_address(raw)
    except ValueError:
        if not _HOSTNAME.match(raw):
            raise _Invalid("an IP address or host name to listen on") from None
    return raw


def _integer(raw: str, expected: str) -> int:
    try:
        return int(raw, 10)
    except ValueError:
        raise _Invalid(expected) from None


def _port(raw: str) -> int:
    value = _integer(raw, "a TCP port 0-65535")
    if not 0 <= value <= 65535:
        raise _Invalid("a TCP port 0-65535")
    return value


def _positive_int(raw: str) -> int:
    value = _integer(raw, "a positive integer")
    if value < 1:
        raise _Invalid("a positive integer")
    return value


def _non_negative_int(raw: str) -> int:
    value = _integer(raw, "an integer >= 0")
    if value < 0:
        raise _Invalid("an integer >= 0")
    return value


def _retries(raw: str) -> int:
    value = _integer(raw, f"an integer 0-{MAX_WEBHOOK_RETRIES}")
    if not 0 <= value <= MAX_WEBHOOK_RETRIES:
        raise _Invalid(f"an integer 0-{MAX_WEBHOOK_RETRIES}")
    return value


def _float(raw: str, expected: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise _Invalid(expected) from None
    if value != value or value in (float("inf"), float("-inf")):
        raise _Invalid(expected)
    return value


def _positive_float(raw: str) -> float:
    value = _float(raw, "a number of seconds > 0")
    if value <= 0:
        raise _Invalid("a number of seconds > 0")
    return value


def _non_negative_float(raw: str) -> float:
    value = _float(raw, "a number of seconds >= 0")
    if value < 0:
        raise _Invalid("a number of seconds >= 0")
    return value


def _prefix_list(raw: str) -> tuple[str, ...]:
    prefixes = tuple(dict.fromkeys(p.strip().lower() for p in raw.split(",") if p.strip()))
    if any(not p.isprintable() or " " in p or ":" in p for p in prefixes):
        raise _Invalid("a comma-separated list of header-name prefixes like X-Custom-")
    return prefixes


def _secret(raw: str) -> str:
    if not raw:
        raise _Invalid("a non-empty secret (unset the variable to turn signing off)")
    return raw


def _path(raw: str) -> Path:
    path = Path(raw).expanduser()
    if not path.is_file():
        raise _Invalid("the path of a readable PEM file")
    return path


def _log_level(raw: str) -> str:
    value = raw.upper()
    if value not in LOG_LEVELS:
        raise _Invalid("one of " + ", ".join(LOG_LEVELS))
    return value
