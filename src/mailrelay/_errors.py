"""The relay's error tree.

RelayError
 ├ ListenFailed         a listener cannot be opened (start-up only)
 ├ MessageParseError    an accepted message cannot be turned into a payload
 │  ├ AttachmentRejected    an attachment breaks the attachment policy (POLICY_ACTION=reject)
 │  │  └ AttachmentTooLarge     one attachment exceeds ATTACHMENT_MAX_BYTES (old name MAX_ATTACHMENT_SIZE)
 │  └ HtmlTextTooLong       html2text output outgrew its budget (the plain part is used instead)
 └ DeliveryError        the webhook could not be reached or refused the message
    ├ AttachmentStoreFailed  an attachment could not be uploaded to object storage
    └ QueueUnavailable       queue mode: the JetStream stream did not store the message (NATS down, no answer)

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


class AttachmentRejected(MessageParseError):
    """An attachment breaks a rule of the attachment policy and the policy's action is `reject`.

    `rule` is the rule's name as logged (`max_bytes`, `max_total_bytes`, `max_count`, `denied_type`,
    `type_not_allowed`, `denied_extension`); the message never carries the attachment's content.
    """

    def __init__(self, message: str, *, rule: str, filename: str | None, content_type: str, size: int) -> None:
        super().__init__(message)
        self.rule = rule
        self.filename = filename
        self.content_type = content_type
        self.size = size


class AttachmentTooLarge(AttachmentRejected):
    """An attachment's decoded size is above the configured cap."""

    def __init__(self, *, filename: str | None, size: int, limit: int, content_type: str = "") -> None:
        super().__init__(
            f"attachment {filename or '<unnamed>'!r} is {size} bytes, limit {limit}",
            rule="max_bytes",
            filename=filename,
            content_type=content_type,
            size=size,
        )
        self.limit = limit


class HtmlTextTooLong(MessageParseError):
    """The HTML part's text conversion outgrew its budget (hostile nesting); see _payload.html_to_text."""


class DeliveryError(RelayError):
    """The webhook could not be reached or refused the message."""


class AttachmentStoreFailed(DeliveryError):
    """Uploading an attachment to object storage failed (timeout, connection error, an S3 error answer).

    `reason` is short and safe to log (no credentials, no presigned URLs, no content).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"attachment upload failed: {reason}")
        self.reason = reason


class QueueUnavailable(DeliveryError):
    """Queue mode: the message could not be stored in the stream (the connection is down, no acknowledgement in
    time, the stream refused it). `reason` is short and safe to log (never the NATS URL or its credentials)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"queue unavailable: {reason}")
        self.reason = reason
