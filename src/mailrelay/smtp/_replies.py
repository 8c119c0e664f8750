"""Every SMTP reply the relay sends, as named constants shared by the server and the tests.

Texts marked "spec" are fixed by spec/mail-relay.md; the others follow RFC 5321 (and RFC 3463 for
the enhanced status codes) where the spec is silent.
"""

from __future__ import annotations

from dataclasses import dataclass

SERVER_NAME = "MailRelay"


@dataclass(frozen=True, slots=True, kw_only=True)
class Reply:
    """One single-line SMTP reply: a three-digit code and its text."""

    code: int
    text: str

    def __str__(self) -> str:
        return f"{self.code} {self.text}"

    def line(self) -> bytes:
        """The reply as it goes on the wire, CRLF included."""
        return f"{self.code} {self.text}\r\n".encode()


# spec: the state table
GREETING = Reply(code=220, text=f"{SERVER_NAME} SMTP Server Ready")
HELO_OK = Reply(code=250, text=SERVER_NAME)
STARTTLS_GO_AHEAD = Reply(code=220, text="Go ahead")
BAD_SEQUENCE = Reply(code=503, text="Bad sequence of commands")
STARTTLS_ALREADY_ACTIVE = Reply(code=503, text="STARTTLS already active")
MAIL_FROM_SYNTAX = Reply(code=501, text="Syntax error in MAIL FROM parameters")
OK = Reply(code=250, text="OK")
NO_SUCH_USER = Reply(code=550, text="No such user here")
OTHER_ROUTE = Reply(code=452, text="4.5.3 Recipient of another route: send it in a separate transaction")
TOO_MANY_RECIPIENTS = Reply(code=452, text="4.5.3 Too many recipients")  # RFC 5321 4.5.3.1.10
START_MAIL_INPUT = Reply(code=354, text="Start mail input; end with <CRLF>.<CRLF>")
MESSAGE_ACCEPTED = Reply(code=250, text="OK: Message accepted for delivery")
BYE = Reply(code=221, text="Bye")

# RFC 5321 where the spec is silent
RCPT_TO_SYNTAX = Reply(code=501, text="Syntax error in RCPT TO parameters")
SYNTAX_ERROR = Reply(code=501, text="5.5.4 Syntax error in parameters or arguments")
UNRECOGNIZED_COMMAND = Reply(code=500, text="5.5.2 Syntax error, command unrecognized")
COMMAND_TOO_LONG = Reply(code=500, text="5.5.2 Command line too long")
DATA_LINE_TOO_LONG = Reply(code=500, text="5.5.2 Line too long (RFC 5321 4.5.3.1.6)")
PARAMETERS_NOT_IMPLEMENTED = Reply(code=555, text="5.5.4 Parameters not recognized or not implemented")
NOT_IMPLEMENTED = Reply(code=502, text="5.5.1 Command not implemented")
CANNOT_VRFY = Reply(code=252, text="2.1.5 Cannot VRFY user, but will accept message and attempt delivery")
HELP = Reply(code=214, text="2.0.0 Commands: EHLO HELO STARTTLS MAIL RCPT DATA RSET NOOP QUIT VRFY HELP")
TLS_NOT_AVAILABLE = Reply(code=454, text="4.7.0 TLS not available")
SIZE_DECLARED_TOO_LARGE = Reply(code=552, text="5.3.4 Declared message size exceeds fixed limit")
MESSAGE_TOO_LARGE = Reply(code=552, text="5.3.4 Message size exceeds fixed limit")
ATTACHMENT_TOO_LARGE = Reply(code=552, text="5.3.4 Attachment size exceeds fixed limit")
ATTACHMENTS_TOO_LARGE = Reply(code=552, text="5.3.4 Total size of attachments exceeds fixed limit")
TOO_MANY_ATTACHMENTS = Reply(code=552, text="5.3.4 Too many attachments")
ATTACHMENT_TYPE_REFUSED = Reply(code=554, text="5.7.1 Attachment type not allowed")
ATTACHMENT_EXTENSION_REFUSED = Reply(code=554, text="5.7.1 Attachment file name extension not allowed")
ATTACHMENT_POLICY_REPLIES = {
    "max_bytes": ATTACHMENT_TOO_LARGE,
    "max_total_bytes": ATTACHMENTS_TOO_LARGE,
    "max_count": TOO_MANY_ATTACHMENTS,
    "denied_type": ATTACHMENT_TYPE_REFUSED,
    "type_not_allowed": ATTACHMENT_TYPE_REFUSED,
    "denied_extension": ATTACHMENT_EXTENSION_REFUSED,
}
"""The reply for each attachment-policy rule when the policy's action is reject (keys: AttachmentRejected.rule)."""
ATTACHMENT_STORE_FAILED = Reply(code=451, text="4.3.0 Attachment storage unavailable, try again later")
RAW_STORE_FAILED = Reply(code=451, text="4.3.0 Message storage unavailable, try again later")
DMARC_NO_AUTHOR = Reply(code=550, text="5.7.1 Message rejected: DMARC needs exactly one From address")
DMARC_TEMPERROR = Reply(code=451, text="4.7.0 DMARC check failed temporarily (DNS), try again later")
QUEUE_UNAVAILABLE = Reply(code=451, text="4.3.0 Queue temporarily unavailable, try again later")
MESSAGE_UNPARSABLE = Reply(code=554, text="5.6.0 Message could not be parsed")
LOCAL_ERROR = Reply(code=451, text="4.3.0 Local error in processing")

# connection hygiene and shutdown: 421 always closes the connection (RFC 5321 3.8)
TOO_MANY_SESSIONS = Reply(code=421, text="4.3.2 Too many connections, try again later")
TOO_MANY_CONNECTIONS = Reply(code=421, text="4.7.0 Too many connections from your address, try again later")
TOO_MANY_UNKNOWN_RCPTS = Reply(code=421, text="4.7.0 Too many unknown recipients, closing connection")
TOO_MANY_BAD_COMMANDS = Reply(code=421, text="4.7.0 Too many unrecognized commands, closing connection")
IDLE_TIMEOUT = Reply(code=421, text="4.4.2 Idle timeout, closing connection")
SHUTTING_DOWN = Reply(code=421, text="4.3.2 Service shutting down, closing connection")
TLS_HANDSHAKE_FAILED = Reply(code=421, text="4.7.0 TLS handshake failed, closing connection")


def temporary_failure(reason: str) -> Reply:
    """451 4.3.0: the webhook did not take the message; the sending server keeps it and retries."""
    return Reply(code=451, text=f"4.3.0 {reason}")


def permanent_failure(reason: str) -> Reply:
    """554 5.6.0: the webhook refused the message for good."""
    return Reply(code=554, text=f"5.6.0 {reason}")


def dmarc_rejected(domain: str) -> Reply:
    """550 5.7.1: the From domain publishes p=reject and the message did not authenticate (`domain` is ASCII)."""
    return Reply(code=550, text=f"5.7.1 Message rejected: unauthenticated mail from {domain} (DMARC policy)")


DEFAULT_SENDER_POLICY_TEXT = "Message refused by the recipient's sender policy"  # MAIL_RELAY_SENDER_POLICY_DENY_TEXT


def sender_policy_denied(text: str) -> Reply:
    """550 5.7.1: the sender policy (MAIL_RELAY_SENDER_POLICY_FILE) denied the message; `text` is configured."""
    return Reply(code=550, text=f"5.7.1 {text}")


def ehlo_lines(*, domain: str, size_limit: int, offer_starttls: bool) -> list[str]:
    """The multi-line EHLO reply: greeting first, extensions, STARTTLS last while it is offered."""
    keywords = [f"SIZE {size_limit}", "8BITMIME", "PIPELINING", "SMTPUTF8"]
    if offer_starttls:
        keywords.append("STARTTLS")
    lines = [f"{SERVER_NAME} greets {domain}", *keywords]
    return [f"250-{text}" for text in lines[:-1]] + [f"250 {lines[-1]}"]
