"""The relay's error tree.

RelayError
 ├ ListenFailed         a listener cannot be opened (start-up only)
 ├ MessageParseError    an accepted message cannot be turned into a payload
 │  ├ AttachmentTooLarge    one attachment exceeds MAX_ATTACHMENT_SIZE
 │  └ HtmlTextTooLong       html2text output outgrew its budget (the plain part is used instead)
 └ DeliveryError        the webhook could not be reached or refused the message

ConfigError (``bastion_core.ConfigError``, a ``ValueError``) stands apart from the tree: a MAIL_RELAY_* setting
is missing or invalid. Bastion raises the same class; it is raised only while settings load.
"""

from __future__ import annotations


class RelayError(Exception):
    """Base class of every error the relay raises on purpose (except ConfigError, see above)."""


class ListenFailed(RelayError):
    """A listener could not be opened; names the variables that chose its address."""

    def __init__(self, variables: str, address: str, reason: OSError) -> None:
        super().__init__(f"{variables}: cannot listen on {address}: {reason}")
        self.variables = variables
        self.address = address
        self.reason = str(reason)


class MessageParseError(RelayError):
    """The message bytes cannot be shaped into a webhook payload."""


class AttachmentTooLarge(MessageParseError):
    """An attachment's decoded size is above the configured cap."""

    def __init__(self, *, filename: str | None, size: int, limit: int) -> None:
        super().__init__(f"attachment {filename or '<unnamed>'!r} is {size} bytes, limit {limit}")
        self.filename = filename
        self.size = size
        self.limit = limit


class HtmlTextTooLong(MessageParseError):
    """The HTML part's text conversion outgrew its budget (hostile nesting); see _payload.html_to_text."""


class DeliveryError(RelayError):
    """The webhook could not be reached or refused the message."""
