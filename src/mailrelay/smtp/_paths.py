"""Pure parsing of SMTP command arguments: MAIL FROM / RCPT TO paths, ESMTP parameters, the EHLO/HELO domain.

No I/O and no event loop: the protocol calls these and turns their answers into replies.
"""

from __future__ import annotations

import re
from email._header_value_parser import get_addr_spec, get_angle_addr
from email.errors import HeaderParseError

from mailrelay.smtp import _replies as r
from mailrelay.smtp._replies import Reply

DEFAULT_DOMAIN = "client"  # spec: EHLO without a domain greets `client`
MAX_DOMAIN_LENGTH = 255  # RFC 5321 4.5.3.1.2
BODY_TYPES = frozenset({"7BIT", "8BITMIME"})  # RFC 6152; BINARYMIME (RFC 3030) is not offered
_SAFE_DOMAIN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:[]")

# RFC 5321 4.1.2 Mailbox with a dot-atom local part and a plain domain: the common case, parsed fast.
_SIMPLE_PATH = re.compile(
    r"\s*<([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
    r"@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*)>(.*)\Z",
    re.DOTALL,
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def strip_keyword(keyword: str, arg: str | None) -> str | None:
    """What follows `keyword` (``FROM:``, ``TO:``; case-insensitive) in a command argument, stripped; None when
    the argument does not start with it."""
    if arg is None or arg[: len(keyword)].upper() != keyword:
        return None
    return arg[len(keyword) :].strip()


def parse_path(path: str) -> tuple[str | None, str | None]:
    """The address of a MAIL/RCPT path and the text after it (its ESMTP parameters).

    ``<>`` comes back as the address ``"<>"`` (the caller decides what the null path means), an empty path as
    ``("", "")`` and anything unparsable as ``(None, None)``. A plain ``<dot-atom@domain>`` is read with one regex
    (about 60 times faster); anything else goes to the standard library's RFC 5322 parser, as aiosmtpd's does, and
    its IndexErrors on hostile input also mean "no address", as does a control character in the address.
    """
    match = _SIMPLE_PATH.match(path)
    if match is not None:
        return match.group(1), match.group(2)
    try:
        address, rest = _parse_rfc5322_path(path)
    except Exception:
        return None, None
    if address is not None and _CONTROL.search(address):
        # A bare CR, a NUL or another control character (the line itself ends at CRLF): not an address RFC 5321
        # allows, and nothing that could reach a payload or a log line.
        return None, None
    return address, rest


def _parse_rfc5322_path(path: str) -> tuple[str | None, str | None]:
    if not path:
        return "", ""
    try:
        if path.lstrip().startswith("<"):
            angle, rest = get_angle_addr(path)
            return angle.addr_spec, rest
        spec, rest = get_addr_spec(path)
        return spec.addr_spec, rest
    except HeaderParseError:
        return None, None


def parse_parameters(words: list[str]) -> dict[str, str | bool] | None:
    """ESMTP parameters (``SIZE=123``, ``SMTPUTF8``) as a dict, a bare keyword as True; None when one of them is
    malformed (RFC 5321 4.1.2 esmtp-param: an alphanumeric keyword, then optionally ``=`` and a non-empty value)."""
    params: dict[str, str | bool] = {}
    for word in words:
        keyword, equals, value = word.partition("=")
        if not keyword.isalnum() or (equals and not value):
            return None
        params[keyword] = value if equals else True
    return params


def check_mail_parameters(words: list[str], *, max_message_size: int) -> Reply | None:
    """None when MAIL FROM's parameters (upper-cased words) are acceptable, else the reply refusing them.

    Understood: BODY=7BIT|8BITMIME (RFC 6152), SMTPUTF8 (RFC 6531) and SIZE=n (RFC 1870, 552 above the limit).
    """
    params = parse_parameters(words)
    if params is None:
        return r.MAIL_FROM_SYNTAX
    if params.pop("BODY", "7BIT") not in BODY_TYPES:
        return r.MAIL_FROM_SYNTAX
    if params.pop("SMTPUTF8", True) is not True:
        return r.MAIL_FROM_SYNTAX
    size = params.pop("SIZE", None)
    if size is not None:
        if not isinstance(size, str) or not size.isdigit():
            return r.MAIL_FROM_SYNTAX
        if int(size) > max_message_size:
            return r.SIZE_DECLARED_TOO_LARGE
    if params:
        return r.PARAMETERS_NOT_IMPLEMENTED
    return None


def printable_domain(arg: str | None) -> str:
    """The EHLO/HELO argument as echoed back: `client` when omitted, odd characters replaced, at most 255."""
    words = arg.split() if arg else []
    if not words:  # also an argument of only whitespace (str.split knows more of it than the command parser)
        return DEFAULT_DOMAIN
    word = words[0]
    return "".join(c if c in _SAFE_DOMAIN_CHARS else "?" for c in word)[:MAX_DOMAIN_LENGTH]
