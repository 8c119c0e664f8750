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
from dataclasses import dataclass

from mailrelay._parsing import SIMPLE_ADDRESS, decode_header_value, simple_address_pairs, simple_pair

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
# The usual Date (`Sat, 21 Nov 2026 09:30:00 +0100`) read without email.utils.parsedate_to_datetime, same result:
# a 4-digit year from 1000, a numeric zone; anything else (names of zones, 2-digit years, comments) goes to it.
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_SIMPLE_DATE = re.compile(
    rf"(?:(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), )?([0-9]{{1,2}}) ({'|'.join(_MONTHS)}) ([1-9][0-9]{{3}}) "
    r"([0-9]{2}):([0-9]{2})(?::([0-9]{2}))? ([+-])([0-9]{2})([0-9]{2})"
)
_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # February of a leap year: _leap
_MONTH_DAYS = {  # name: (number, days), both as 2-digit strings
    name: (f"{number:02d}", f"{days:02d}")
    for number, (name, days) in enumerate(zip(_MONTHS, _DAYS, strict=True), start=1)
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Address:
    address: str
    name: str | None = None

    def to_dict(self) -> dict[str, str]:
        return {"address": self.address} if self.name is None else {"address": self.address, "name": self.name}


def clean(text: str, limit: int) -> str:
    """Control characters (C0, C1, line and paragraph separators) turned into one space, trimmed, cut at `limit`."""
    return _CONTROL.sub(" ", text[: limit * 2]).strip()[:limit].strip()


def message_id(value: str | None) -> str | None:
    """The id of a Message-ID or In-Reply-To header without its angle brackets; None when there is none or it is
    over MAX_ID_CHARS."""
    if value is None:
        return None
    if value[:1] == "<" and value[-1:] == ">" and 2 < len(value) <= MAX_ID_CHARS + 2 and value.isascii():
        # the usual `<id>` alone: in printable ASCII the only blank is the space (the rest are control characters)
        bracketed = value[1:-1]
        if value.isprintable() and " " not in bracketed and "<" not in bracketed and ">" not in bracketed:
            return bracketed
    match = _ID.search(value)  # message_ids(value, limit=1) without keeping the rest
    while match is not None:
        identifier = _identifier(match.group(1))
        if identifier is not None:
            return identifier
        match = _ID.search(value, match.end())
    return _bare_id(value)


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
        bare = _bare_id(value)
        return [bare] if bare else []
    return [first, *recent][:limit]


def _bare_id(value: str) -> str | None:
    bare = _BARE_ID.match(value) if len(value) <= MAX_ID_CHARS else None
    return _identifier(bare.group(1)) if bare else None


def _identifier(text: str) -> str | None:
    if len(text) > MAX_ID_CHARS:
        return None
    if text.isprintable():  # no control character (the usual id): nothing to remove
        return text
    return _CONTROL.sub("", text) or None


def rfc3339_date(value: str | None) -> str | None:
    """The Date header as RFC 3339 (`2026-11-25T09:30:00+01:00`); an unknown zone (`-0000`) is UTC; None when the
    value is not an RFC 5322 date."""
    if value is None or len(value) > MAX_ID_CHARS:
        return None
    simple = _SIMPLE_DATE.fullmatch(value)
    if simple is not None:
        return _simple_date(simple)
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed.isoformat()


def _simple_date(match: re.Match[str]) -> str | None:
    """`_SIMPLE_DATE`'s match as parsedate_to_datetime reads it, written as datetime.isoformat writes it without
    building one (fields compared and joined as the 2-digit strings they are): `-0000` is UTC too, a zone's
    minutes may exceed 59 (+0160 is two hours), a zone of a day or more and out-of-range fields are no date."""
    day, month, year, hour, minute, second, sign, zone_hours, zone_minutes = match.groups()
    number, last = _MONTH_DAYS[month]
    if len(day) == 1:
        day = "0" + day
    if last == "28" and _leap(int(year)):
        last = "29"
    second = second or "00"
    if not "00" < day <= last or hour > "23" or minute > "59" or second > "59":
        return None
    if zone_minutes < "60":
        if zone_hours > "23":
            return None
        zone = f"{sign}{zone_hours}:{zone_minutes}" if zone_hours != "00" or zone_minutes != "00" else "+00:00"
    else:
        offset = int(zone_hours) * 60 + int(zone_minutes)
        if offset >= 24 * 60:
            return None
        zone = f"{sign}{offset // 60:02d}:{offset % 60:02d}"
    return f"{year}-{number}-{day}T{hour}:{minute}:{second}{zone}"


def _leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def addresses(raw: str | None) -> list[Address]:
    """The valid addresses of a raw (undecoded) To, Cc or Reply-To value, names decoded (RFC 2047) and cleaned;
    malformed entries are skipped, at most MAX_ADDRESSES kept."""
    if raw is None:
        return []
    text = raw[:MAX_SCANNED_CHARS].replace("\r", " ").replace("\n", " ")
    pairs = simple_address_pairs(text)
    if pairs is not None:
        return _simple_addresses(pairs)
    try:
        pairs = email.utils.getaddresses([text])
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


def address_dicts(raw: str) -> list[dict[str, str]]:
    """``[a.to_dict() for a in addresses(raw)]``, the JSON of payload v2's `to`, `cc` and `reply_to`. The usual
    value, one `SIMPLE_ADDRESS` of at most MAX_ADDRESS_CHARS characters (`local@domain`, `<local@domain>`, `Name
    <local@domain>`), is read with one match and written as its dictionary at once."""
    if "," not in raw and len(raw) <= MAX_ADDRESS_CHARS:
        match = SIMPLE_ADDRESS.fullmatch(raw.strip(" \t"))
        if match is not None:
            name, address = simple_pair(match)
            display = _simple_display(name) if name else None
            return [{"address": address} if display is None else {"address": address, "name": display}]
    return [address.to_dict() for address in addresses(raw)]


def _simple_addresses(pairs: list[tuple[str, str]]) -> list[Address]:
    """`addresses`' loop for `simple_address_pairs`: an atext address has no control character and always matches
    `_ADDRESS`."""
    out: list[Address] = []
    for name, address in pairs:
        if len(address) > MAX_ADDRESS_CHARS:
            continue
        out.append(Address(address=address, name=_simple_display(name)))
        if len(out) >= MAX_ADDRESSES:
            break
    return out


def _simple_display(name: str) -> str | None:
    """The display name of a `simple_address_pairs` name: one without an encoded word is already clean (words joined by
    one space)."""
    if "=?" in name:
        display = clean(decode_header_value(name[: MAX_NAME_CHARS * 8]), MAX_NAME_CHARS)
    else:
        display = name[:MAX_NAME_CHARS].rstrip()
    return display or None


def plus_tag(recipient: str) -> str | None:
    """The `detail` of `user+detail@domain`, or None (no `+`, or nothing after it)."""
    local = recipient.rpartition("@")[0]
    tag = local.partition("+")[2]
    return tag or None
