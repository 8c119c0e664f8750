"""MAIL_RELAY_* values: each variable's converter from text (what it accepts, the expectation an error names) and
the annotated types the settings model declares its fields with. Pure: no environment, no files."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal, get_args

import httpx
from pydantic import BeforeValidator
from pydantic_core import PydanticUseDefault

from bastion_core import ConfigError, mask_url
from mailrelay._routing import parse_pattern

PREFIX = "MAIL_RELAY_"
MAX_WEBHOOK_RETRIES = 20
MAX_QUEUE_ATTEMPTS = 1000
MAX_PRESIGN_SECS = 604_800  # SigV4 presigned URLs live at most 7 days
DNS_PORT = 53
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
REDACTED = "<redacted>"
REQUIRED = "a value (this variable is required)"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})
_EMAIL = re.compile(r"^[^@\s,<>]+@[^@\s,<>]+$")
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$")
SECRETS = frozenset({PREFIX + "WEBHOOK_SIGNING_SECRET"})
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
RawMode = Literal["off", "s3", "inline"]
RAW_MODES: tuple[str, ...] = get_args(RawMode)
PolicyAction = Literal["drop", "reject"]
POLICY_ACTIONS: tuple[str, ...] = get_args(PolicyAction)
_MIME_TOKEN = r"[a-z0-9!#$&^_.+-]+"
_MIME_PATTERN = re.compile(rf"^(\*/\*|{_MIME_TOKEN}/(\*|{_MIME_TOKEN}))$")
_EXTENSION = re.compile(r"^[a-z0-9_+~-]{1,32}$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")  # S3 bucket naming rules (DNS-compatible)
_KEY_PREFIX = re.compile(r"^[A-Za-z0-9!_.*'()/-]{0,512}$")  # S3's "safe characters" for object keys
_REGION = re.compile(r"^[a-z0-9-]{1,64}$")


def variable_name(field_name: str) -> str:
    return PREFIX + field_name.upper()


def read_variable(
    raw: object, convert: Callable[[str], object], *, required: bool = False, secret: bool = False
) -> object:
    """One variable's text through its converter. Whitespace around a value is dropped and a blank value means
    unset (the default), except for a secret, which is taken verbatim; a value given in Python passes as is."""
    if not isinstance(raw, str):
        return raw
    if secret:
        return convert(raw)
    if not raw.strip():
        if required:
            raise ValueError(REQUIRED)
        raise PydanticUseDefault()
    return convert(raw.strip())


def env(convert: Callable[[str], object], *, required: bool = False, secret: bool = False) -> BeforeValidator:
    return BeforeValidator(lambda raw: read_variable(raw, convert, required=required, secret=secret))


def parse_email_list(raw: str) -> frozenset[str]:
    emails = [part.strip().lower() for part in raw.split(",") if part.strip()]
    bad = [e for e in emails if not _EMAIL.match(e)]
    if not emails or bad:
        raise ValueError("a comma-separated list of addresses like inbox@example.com")
    return frozenset(emails)


def check_target_patterns(targets: frozenset[str], *, strip_tag: bool, required: bool) -> frozenset[str]:
    """MAIL_RELAY_TARGET_EMAILS: each a pattern that can match (`mailrelay._routing.parse_pattern`); ConfigError
    naming the first that cannot, or the missing value when `required` (no routes file)."""
    if not targets and required:
        raise ConfigError.invalid(PREFIX + "TARGET_EMAILS", None, REQUIRED)
    for text in sorted(targets):
        try:
            parse_pattern(text, strip_tag=strip_tag)
        except ValueError as exc:
            raise ConfigError(f"{PREFIX}TARGET_EMAILS: {exc}") from None
    return targets


def parse_routes_file(raw: str) -> Path:
    """A readable file (the routes file, the sender policy): checked here, read where it is used."""
    path = Path(raw).expanduser()
    if not path.is_file():
        raise ValueError("the path of a readable file")
    return path


def parse_sender_policy_text(raw: str) -> str:
    """The text after `550 5.7.1 ` of a Deny: printable ASCII, one line, at most 200 characters."""
    if len(raw) > 200 or not all(" " <= c <= "~" for c in raw):
        raise ValueError("one line of printable ASCII text, at most 200 characters")
    return raw


def is_loopback_host(host: str) -> bool:
    """True for `localhost` and loopback IP literals (127.0.0.0/8, ::1), judged on the parsed host."""
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_webhook_url(raw: str, *, allow_insecure: bool) -> str:
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


def parse_boolean(raw: str) -> bool:
    value = raw.lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError("a boolean (true/false, 1/0, yes/no, on/off)")


def parse_bind_address(raw: str) -> str:
    try:
        ipaddress.ip_address(raw)
    except ValueError:
        if not _HOSTNAME.match(raw):
            raise ValueError("an IP address or host name to listen on") from None
    return raw


def parse_integer(raw: str, expected: str, low: int, high: int | None = None) -> int:
    try:
        value = int(raw, 10)
    except ValueError:
        raise ValueError(expected) from None
    if value < low or (high is not None and value > high):
        raise ValueError(expected)
    return value


def parse_tcp_port(raw: str) -> int:
    return parse_integer(raw, "a TCP port 0-65535", 0, 65535)


def parse_positive_int(raw: str) -> int:
    return parse_integer(raw, "a positive integer", 1)


def parse_non_negative_int(raw: str) -> int:
    return parse_integer(raw, "an integer >= 0", 0)


def parse_failure_rate(raw: str) -> float:
    expected = "a failure rate between 0.0 and 1.0"
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(expected) from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(expected)
    return value


def parse_removed_breaker_threshold(raw: str) -> None:
    raise ValueError(
        "nothing: this variable was removed; the breaker now opens on a failure rate over webhook attempts, "
        "set MAIL_RELAY_CIRCUIT_BREAKER_FAILURE_RATE (0.0-1.0) and MAIL_RELAY_CIRCUIT_BREAKER_MIN_REQUESTS instead"
    )


def parse_payload_version(raw: str) -> int:
    return parse_integer(raw, "1 (the specification's payload) or 2", 1, 2)


def parse_retries(raw: str) -> int:
    return parse_integer(raw, f"an integer 0-{MAX_WEBHOOK_RETRIES}", 0, MAX_WEBHOOK_RETRIES)


def parse_seconds(raw: str, expected: str, *, allow_zero: bool) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(expected) from None
    if value != value or value in (float("inf"), float("-inf")) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(expected)
    return value


def parse_positive_seconds(raw: str) -> float:
    return parse_seconds(raw, "a number of seconds > 0", allow_zero=False)


def parse_non_negative_seconds(raw: str) -> float:
    return parse_seconds(raw, "a number of seconds >= 0", allow_zero=True)


def parse_prefix_list(raw: str) -> tuple[str, ...]:
    prefixes = tuple(dict.fromkeys(p.strip().lower() for p in raw.split(",") if p.strip()))
    if any(not p.isprintable() or " " in p or ":" in p for p in prefixes):
        raise ValueError("a comma-separated list of header-name prefixes like X-Custom-")
    return prefixes


def parse_secret(raw: str) -> str:
    if not raw:
        raise ValueError("a non-empty secret (unset the variable to turn signing off)")
    return raw


def parse_pem_path(raw: str) -> Path:
    path = Path(raw).expanduser()
    if not path.is_file():
        raise ValueError("the path of a readable PEM file")
    return path


def parse_log_level(raw: str) -> str:
    value = raw.upper()
    if value not in LOG_LEVELS:
        raise ValueError("one of " + ", ".join(LOG_LEVELS))
    return value


def parse_log_format(raw: str) -> str:
    value = raw.lower()
    if value not in LOG_FORMATS:
        raise ValueError("one of " + ", ".join(LOG_FORMATS))
    return value


def parse_choice(raw: str, choices: tuple[str, ...]) -> str:
    value = raw.lower()
    if value not in choices:
        raise ValueError("one of " + ", ".join(choices))
    return value


def parse_dns_servers(raw: str) -> tuple[tuple[str, int], ...]:
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
        servers.append((str(address), parse_integer(port, expected, 1, 65535)))
    if not servers:
        raise ValueError(expected)
    return tuple(dict.fromkeys(servers))


def parse_mime_types(raw: str) -> tuple[str, ...]:
    types = tuple(dict.fromkeys(t.strip().lower() for t in raw.split(",") if t.strip()))
    if not types or not all(_MIME_PATTERN.match(t) for t in types):
        raise ValueError("a comma-separated list of MIME types like application/pdf, image/*")
    return types


def parse_extensions(raw: str) -> frozenset[str]:
    extensions = [e.strip().lower().lstrip(".") for e in raw.split(",") if e.strip()]
    if not extensions or not all(_EXTENSION.match(e) for e in extensions):
        raise ValueError("a comma-separated list of file extensions like exe, js, bat")
    return frozenset(extensions)


def parse_bucket(raw: str) -> str:
    if not _BUCKET.match(raw) or ".." in raw:
        raise ValueError("an S3 bucket name (3-63 characters: lower-case letters, digits, dots, hyphens)")
    return raw


def parse_key_prefix(raw: str) -> str:
    if not _KEY_PREFIX.match(raw) or raw.startswith("/") or ".." in raw.split("/") or "//" in raw:
        raise ValueError("an S3 key prefix like attachments/ (letters, digits and !_.*'()/-, no leading /)")
    return raw


def parse_endpoint_url(raw: str) -> str:
    try:
        url = httpx.URL(raw)
    except (httpx.InvalidURL, TypeError, ValueError):
        raise ValueError("an absolute http(s) URL like http://127.0.0.1:9000") from None
    if url.scheme not in ("http", "https") or not url.host or url.query or url.fragment:
        raise ValueError("an absolute http(s) URL like http://127.0.0.1:9000")
    if url.port is not None and not 1 <= url.port <= 65535:
        raise ValueError("an absolute http(s) URL with a port 1-65535")
    return raw


def parse_region(raw: str) -> str:
    if not _REGION.match(raw):
        raise ValueError("an AWS region name like eu-central-1")
    return raw


def parse_presign_secs(raw: str) -> int:
    return parse_integer(raw, f"a number of seconds 1-{MAX_PRESIGN_SECS}", 1, MAX_PRESIGN_SECS)


def parse_nats_urls(raw: str) -> str:
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


def parse_stream_name(raw: str) -> str:
    if not _STREAM_NAME.match(raw):
        raise ValueError("a JetStream stream name (1-64 letters, digits, _ and -)")
    return raw


def parse_queue_attempts(raw: str) -> int:
    return parse_integer(raw, f"an integer 1-{MAX_QUEUE_ATTEMPTS}", 1, MAX_QUEUE_ATTEMPTS)


def mask_nats_url(url: str) -> str:
    """NATS URLs as shown in errors and logs: a password, a token (``nats://TOKEN@host``) and a query become
    ``***``; comma-separated cluster lists are masked one by one."""
    return mask_url(url, cluster=True)


Port = Annotated[int, env(parse_tcp_port)]
PositiveInt = Annotated[int, env(parse_positive_int)]
PositiveSeconds = Annotated[float, env(parse_positive_seconds)]
NonNegativeSeconds = Annotated[float, env(parse_non_negative_seconds)]
BindAddress = Annotated[str, env(parse_bind_address)]
PemPath = Annotated[Path | None, env(parse_pem_path)]
OptionalPositiveInt = Annotated[int | None, env(parse_positive_int)]
OptionalNonNegativeInt = Annotated[int | None, env(parse_non_negative_int)]
MimeTypes = Annotated[tuple[str, ...], env(parse_mime_types)]
