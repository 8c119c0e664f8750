"""MailRelay: an SMTP server that turns accepted mail into signed JSON webhooks.

The public API is what ``__all__`` names: settings, the error classes, and the signing helpers a webhook
receiver uses. Test helpers live in :mod:`mailrelay.testing`, the SMTP building blocks in :mod:`mailrelay.smtp`;
every ``_module`` is internal and may change in any release.
"""

from __future__ import annotations

from bastion_core import ConfigError
from mailrelay._config import Settings, load_settings, parse_settings
from mailrelay._errors import (
    AttachmentTooLarge,
    DeliveryError,
    HtmlTextTooLong,
    ListenFailed,
    MessageParseError,
    RelayError,
)
from mailrelay._signing import compute_signature, verify_signature
from mailrelay._version import __version__

__all__ = [
    "AttachmentTooLarge",
    "ConfigError",
    "DeliveryError",
    "HtmlTextTooLong",
    "ListenFailed",
    "MessageParseError",
    "RelayError",
    "Settings",
    "__version__",
    "compute_signature",
    "load_settings",
    "parse_settings",
    "verify_signature",
]
