"""MailRelay: an SMTP server that turns accepted mail into signed JSON webhooks."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("bastion")  # the distribution that ships both packages
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

from mailrelay.breaker import BreakerState, CircuitBreaker
from mailrelay.config import Settings, load_settings, parse_settings
from mailrelay.delivery import DeliveryOutcome, DeliveryResult, WebhookClient
from mailrelay.errors import (
    AttachmentTooLarge,
    ConfigError,
    DeliveryError,
    HtmlTextTooLong,
    ListenFailed,
    MessageParseError,
    RelayError,
)
from mailrelay.parsing import ParsedMessage, parse_message
from mailrelay.payload import WebhookPayload, build_payload
from mailrelay.relay import Relay
from mailrelay.signing import compute_signature, verify_signature

__all__ = [
    "AttachmentTooLarge",
    "BreakerState",
    "CircuitBreaker",
    "ConfigError",
    "DeliveryError",
    "DeliveryOutcome",
    "DeliveryResult",
    "HtmlTextTooLong",
    "ListenFailed",
    "MessageParseError",
    "ParsedMessage",
    "Relay",
    "RelayError",
    "Settings",
    "WebhookClient",
    "WebhookPayload",
    "__version__",
    "build_payload",
    "compute_signature",
    "load_settings",
    "parse_message",
    "parse_settings",
    "verify_signature",
]
