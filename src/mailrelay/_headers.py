"""Payload v2's header fields: message ids and threading, the date, the To/Cc/Reply-To addresses, each bounded.

Pure. Hostile values never raise and never reach the payload unbounded (docs/mailrelay.md, "Payload v2 caps"):
a message id longer than MAX_ID_CHARS is left out (a cut id would name another message), `references` keeps the
first id (the thread's root) and the last MAX_REFERENCES - 1, an address list keeps its first MAX_ADDRESSES valid
addresses, names are cut at MAX_NAME_CHARS, and control characters are removed from all of them.
"""

from __future__ import annotations

import collections
import datetime
import email.utils
import re
from collections.abc import Iterable
from dataclasses import dataclass

from mailrelay._parsing import decode_header_value

MAX_ID_CHARS = 998  # RFC 5322 2.1.1: no line is longer, so no single id is either
MAX_REFERENCES = 100  # ids in `references`: the root plus the most recent 99
MAX_ADDRESSES = 100  # addresses per To, Cc and Reply-To (RFC 5321 4.5.3.1.8's recipient buffer)
MAX_ADDRESS_CHARS = 320  # RFC 5321 4.5.3.1: 64 (local part) + 1 + 255 (domain)
MAX_NAME_CHARS = 256  # characters of a display name
MAX_SCANNED_CHARS = 256 * 1024  # characters of a header value read for ids or addresses; the rest is ignored

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
_ID = re.compile(r"<([^<>\s]+)>")  # unbounded on purpose: a bounded repeat re-scans from every "<"
_BARE_ID = re.compile(r"^\s*([^<>\s@]+@[^<>\s@]+)\s*$")
_ADDRESS = re.compile(r"^[^\s@<>()\[\],;:\"]+@[^\s@<>()\[\],;:\"]+$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Address:
    address: str
    name: str | None = None

    def to_dict(self) -> dict[str, str]:
        return {"address": self.address} if self.name is None else {"address": self.address, "name": self.name}


def clean(text: str, limit: int) -> str:
    """Control characters (C0, C1, line and paragraph separators) turned into one space, trimmed, cut at `limit`."""
    return _CONTROL.sub(" ", text[: limit * 2]).strip()[:limit].strip()


def first_header(headers: Iterable[tuple[str, str]], name: str) -> str | None:
    wanted = name.lower()
    for key, value in headers:
        if key.lower() == wanted:
            return value
    return None


def message_id(value: str | None) -> str | None:
    """The id of a Message-ID or In-Reply-To header without its angle brackets; None when there is none or it is
    over MAX_ID_CHARS."""
    if value is None:
        return None
    ids = message_ids(value, limit=1)
    return ids[0] if ids else None


def message_ids(value: str, *, limit: int = MAX_REFERENCES) -> list[str]:
    """The `<id>`s of a References header in order, repeats removed, at most `limit`: the first and the last
    `limit - 1` (ids over MAX_ID_CHARS are skipped); a lone id without brackets counts too."""
    first: str | None = None
    recent: collections.OrderedDict[str, None] = collections.OrderedDict()
    for match in _ID.finditer(value):
        identifier = _identifier(match.group(1))
        if identifier is None or identifier == first:
            continue
        if first is None:
            first = identifier
            continue
        recent.pop(identifier, None)
        recent[identifier] = None
        if len(recent) > limit - 1:
            recent.popitem(last=False)
    if first is None:
        bare = _BARE_ID.match(value) if len(value) <= MAX_ID_CHARS else None
        identifier = _identifier(bare.group(1)) if bare else None
        return [identifier] if identifier else []
    return [first, *recent][:limit]


def _identifier(text: str) -> str | None:
    if len(text) > MAX_ID_CHARS:
        return None
    return _CONTROL.sub("", text) or None


def rfc3339_date(value: str | None) -> str | None:
    """The Date header as RFC 3339 (`2026-11-25T09:30:00+01:00`); an unknown zone (`-0000`) is UTC; None when the
    value is not an RFC 5322 date."""
    if value is None or len(value) > MAX_ID_CHARS:
        return None
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed.isoformat()


def addresses(raw: str | None) -> list[Address]:
    """The valid addresses of a raw (undecoded) To, Cc or Reply-To value, names decoded (RFC 2047) and cleaned;
    malformed entries are skipped, at most MAX_ADDRESSES kept."""
    if raw is None:
        return []
    try:
        pairs = email.utils.getaddresses([raw[:MAX_SCANNED_CHARS].replace("\r", " ").replace("\n", " ")])
    except Exception:  # the stdlib address parser has raised on hostile input before
        return []
    out: list[Address] = []
    for name, address in pairs:
        address = clean(address, MAX_ADDRESS_CHARS + 1)
        if len(address) > MAX_ADDRESS_CHARS or not _ADDRESS.match(address):
            continue
        display = clean(decode_header_value(name[: MAX_NAME_CHARS * 8]), MAX_NAME_CHARS) if name else ""
        out.append(Address(address=address, name=display or None))
        if len(out) >= MAX_ADDRESSES:
            break
    return out


def plus_tag(recipient: str) -> str | None:
    """The `detail` of `user+detail@domain`, or None (no `+`, or nothing after it)."""
    local = recipient.rpartition("@")[0]
    tag = local.partition("+")[2]
    return tag or None
