"""MIME parsing: raw message bytes -> subject, sender name, text/HTML bodies, headers, attachment parts.

Pure and forgiving: malformed MIME, unknown charsets and broken encodings degrade to replacement
characters or raw text, never to an exception. The compat32 policy is used on purpose: it keeps
header values raw, and every decoding step below has its own fallback.
"""

from __future__ import annotations

import codecs
import email.header
import email.utils
import re
from dataclasses import dataclass
from email import policy
from email.message import Message
from email.parser import BytesParser

_FOLDING = re.compile(r"\r?\n[ \t]*")
_BLANKS = re.compile(r"([ \t]+)")
_ENCODED_WORD = re.compile(r"=\?[^?\s]+\?[bBqQ]\?[^?\s]*\?=")
_ENCODED_WORD_AT_END = re.compile(_ENCODED_WORD.pattern + "$")
HEADER_DECODE_PIECE = 4096  # characters of a header value decoded in one go (see decode_header_value)
_ATTACHMENT = "attachment"
_HEADER_BLOCK_END = "\r\n\r\n"
# A header section FeedParser reads without a defect or a special case: every line CRLF-ended, either a field
# (name of printable ASCII but ":", then ":") or a continuation (space or tab) of the field before it.
_PLAIN_HEADERS = re.compile(r"(?:[\x21-\x39\x3b-\x7e]+:[^\r\n]*\r\n(?:[ \t][^\r\n]*\r\n)*)+")
_HEADER_LINE = re.compile(r"[^\r\n]*\r\n")
_NESTED_MAINTYPES = frozenset({"multipart", "message"})
# The common address shapes read without the stdlib's address parser (the same pairs, a fifth of the time): a list
# of `local@domain`, `<local@domain>` or `Name Words <local@domain>`, every part RFC 5322 atext (no quotes,
# comments, dots in names, groups or empty entries; anything else goes to email.utils.getaddresses).
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_DOT_ATOM = rf"{_ATEXT}(?:\.{_ATEXT})*"
SIMPLE_ADDRESS = re.compile(  # matched on an entry without its outer blanks: no two blank runs meet (linear time)
    rf"(?:(?P<name>{_ATEXT}(?:[ \t]+{_ATEXT})*)[ \t]*)?<(?P<angled>{_DOT_ATOM}@{_DOT_ATOM})>"
    rf"|(?P<bare>{_DOT_ATOM}@{_DOT_ATOM})"
)
_BLANK_RUN = re.compile(r"[ \t]+")
_NAMED_FIELDS = frozenset({"content-type", "content-disposition"})
# A Content-Type with one `charset` parameter (`text/plain; charset=utf-8`, the value quoted or not): the charset
# get_content_charset gives, without the stdlib's parameter parsing.
_ONE_CHARSET = re.compile(
    r"[ \t]*[A-Za-z0-9!#$%&'*+.^_`|~-]+/[A-Za-z0-9!#$%&'*+.^_`|~-]+[ \t]*;[ \t]*"
    r"(?i:charset)[ \t]*=[ \t]*(\"?)([A-Za-z0-9!#$%&'+.^_`{}~-]+)\1[ \t]*"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class MimePart:
    """A leaf MIME part that is not one of the chosen bodies: a candidate attachment."""

    content_type: str
    data: bytes
    filename: str | None = None
    content_id: str | None = None
    disposition: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ParsedMessage:
    """What the payload needs from a message, decoded to clean (JSON-safe) text."""

    subject: str
    sender_name: str | None
    from_address: str | None
    text_body: str | None
    html_body: str | None
    headers: tuple[tuple[str, str], ...]
    parts: tuple[MimePart, ...]
    address_headers: tuple[tuple[str, str], ...] = ()
    """The first To, Cc and Reply-To values as received (folded, encoded words kept), keyed `to`, `cc`,
    `reply_to`: payload v2 parses the addresses before decoding the names (a decoded comma is not a separator)."""
    threading_headers: tuple[tuple[str, str], ...] = ()
    """The first Message-ID, In-Reply-To, References and Date values as in `headers` (decoded), keyed by the
    lower-case name: payload v2's threading fields and date."""


_ADDRESS_HEADERS = {"to": "to", "cc": "cc", "reply-to": "reply_to"}  # lower-case name: address_headers key
THREADING_HEADERS = frozenset({"message-id", "in-reply-to", "references", "date"})
_FIRST_RAW = frozenset({"subject", "from", *_ADDRESS_HEADERS})  # the top-level fields read as received


def parse_message(raw: bytes) -> ParsedMessage:
    """Parse RFC 5322 / MIME bytes. Never raises on malformed input."""
    message = _message(raw)
    headers: list[tuple[str, str]] = []
    first_raw: dict[str, str] = {}  # one pass over the fields for all of them (the first of each)
    threading: dict[str, str] = {}
    for raw_name, raw_value in message.raw_items():
        name, value = str(raw_name), str(raw_value)
        lowered = name.lower()
        if lowered in _FIRST_RAW and lowered not in first_raw:
            first_raw[lowered] = value
        key = scrub(name)
        header = (key, decode_header_value(value))
        headers.append(header)
        lowered = lowered if key is name else key.lower()
        if lowered in THREADING_HEADERS and lowered not in threading:
            threading[lowered] = header[1]
    sender_name, from_address = _from_header(first_raw.get("from"))
    walker = _Walker()
    walker.walk(message)
    return ParsedMessage(
        subject=decode_header_value(first_raw.get("subject", "")).strip(),
        sender_name=sender_name,
        from_address=from_address,
        text_body=walker.text,
        html_body=walker.html,
        headers=tuple(headers),
        parts=tuple(walker.parts),
        address_headers=tuple(
            (key, scrub(first_raw[name])) for name, key in _ADDRESS_HEADERS.items() if name in first_raw
        ),
        threading_headers=tuple(threading.items()),
    )


def _message(raw: bytes) -> Message:
    """The compat32 Message of `raw`, as ``BytesParser(policy=compat32).parsebytes(raw)`` builds it.

    Most mail is one part with a plain header section: then the fields are split here (each turned into its raw
    name and value by the policy's own ``header_source_parse``, as FeedParser does) and the rest of the text is
    the payload, as FeedParser sets it for any type but multipart/* and message/*. That takes a fifth of
    FeedParser's time, which reads line by line. Anything else (a multipart or message/* type, a header line
    FeedParser would flag as a defect, an mbox ``From`` line, bare CR or LF in the header section) goes to
    FeedParser itself. tests/mailrelay/test_parsing.py checks both give the same Message on every corpus file.
    """
    text = raw.decode("ascii", "surrogateescape")
    head_end = text.find(_HEADER_BLOCK_END) + 2
    if head_end <= 2 or _PLAIN_HEADERS.fullmatch(text, 0, head_end) is None:
        return BytesParser(policy=policy.compat32).parsebytes(raw)
    message = Message(policy=policy.compat32)
    field: list[str] = []
    for line in _HEADER_LINE.findall(text, 0, head_end):
        if field and line[0] not in " \t":
            message.set_raw(*policy.compat32.header_source_parse(field))
            field = []
        field.append(line)
    message.set_raw(*policy.compat32.header_source_parse(field))
    if message.get_content_maintype() in _NESTED_MAINTYPES:
        return BytesParser(policy=policy.compat32).parsebytes(raw)
    message.set_payload(text[head_end + 2 :])
    return message


def scrub(text: str) -> str:
    """Make text safe for UTF-8 JSON: bytes smuggled as surrogates are decoded, the rest replaced."""
    if text.isascii():  # the usual name, address or header: nothing to check (a surrogate is not ASCII)
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        except UnicodeEncodeError:
            return text.encode("utf-8", "replace").decode("utf-8")
    return text


def decode_bytes(data: bytes, charset: str | None) -> str:
    """Declared charset first, then UTF-8, then the declared charset (or UTF-8) with replacement."""
    name = _codec(charset)
    for candidate in (name, "utf-8"):
        if candidate is None:
            continue
        try:
            return data.decode(candidate)
        except (UnicodeDecodeError, LookupError):
            continue
    try:
        return data.decode(name or "utf-8", "replace")
    except LookupError:
        return data.decode("utf-8", "replace")


def decode_header_value(raw: str) -> str:
    """Unfold and decode RFC 2047 encoded words; undecodable pieces are kept raw or replaced.

    The stdlib decoder is quadratic in the number of encoded words (a 1 MB Subject took seconds, a
    25 MB one would take many minutes), so long values are decoded in pieces of about
    HEADER_DECODE_PIECE characters, cut at whitespace. Whitespace between two encoded words is
    dropped at a cut exactly as inside a piece (RFC 2047 6.2).
    """
    raw = _FOLDING.sub(" ", str(raw))
    if "=?" not in raw:  # no encoded word: what the stdlib decoder would return, without its work
        return scrub(raw)
    if len(raw) <= HEADER_DECODE_PIECE:
        return _decode_words(raw)
    out: list[str] = []
    piece: list[str] = []
    size = 0
    tokens = _BLANKS.split(raw)  # word, blanks, word, blanks, ..., word
    for index in range(0, len(tokens), 2):
        word = tokens[index]
        piece.append(word)
        size += len(word)
        if index + 1 == len(tokens):
            break
        blanks = tokens[index + 1]
        if size < HEADER_DECODE_PIECE:
            piece.append(blanks)
            size += len(blanks)
            continue
        out.append(_decode_words("".join(piece)))
        between_encoded = _ENCODED_WORD_AT_END.search(word) and _ENCODED_WORD.match(tokens[index + 2])
        out.append("" if between_encoded else blanks)
        piece, size = [], 0
    out.append(_decode_words("".join(piece)))
    return "".join(out)


def _decode_words(raw: str) -> str:
    try:
        chunks = email.header.decode_header(raw)
    except Exception:  # a broken encoded word: show the header as it came
        return scrub(raw)
    out: list[str] = []
    for chunk, charset in chunks:
        if isinstance(chunk, str):
            out.append(chunk)
        elif charset is None:
            out.append(chunk.decode("raw-unicode-escape", "replace"))
        else:
            out.append(decode_bytes(chunk, charset))
    decoded = "".join(out)
    return scrub(decoded if decoded.strip() or not raw.strip() else raw)


def _codec(charset: str | None) -> str | None:
    if not charset:
        return None
    try:
        info = codecs.lookup(charset.strip().strip('"').lower())
    except (LookupError, ValueError):
        return None
    # bytes-to-bytes codecs (base64_codec, zlib_codec, ...) are not text encodings
    return info.name if getattr(info, "_is_text_encoding", True) else None


def _raw_header(message: Message, name: str) -> str | None:
    """The first header `name` exactly as received (8-bit bytes still smuggled as surrogates);
    compat32's get() would turn those into an unknown-8bit Header and lose them."""
    wanted = name.lower()
    for key, value in message.raw_items():
        if str(key).lower() == wanted:
            return str(value)
    return None


def simple_address_pairs(text: str) -> list[tuple[str, str]] | None:
    """email.utils.getaddresses([text]) for a list of `SIMPLE_ADDRESS`es (a name's words joined by one space);
    None for any other text."""
    pairs: list[tuple[str, str]] = []
    for entry in text.split(","):
        match = SIMPLE_ADDRESS.fullmatch(entry.strip(" \t"))
        if match is None:
            return None
        pairs.append(simple_pair(match))
    return pairs


def simple_pair(match: re.Match[str]) -> tuple[str, str]:
    """The (name, address) pair of a `SIMPLE_ADDRESS` match, as email.utils.getaddresses gives it."""
    name, angled, bare = match.group("name", "angled", "bare")
    return (_BLANK_RUN.sub(" ", name) if name else "", angled or bare)


def _from_header(raw: str | None) -> tuple[str | None, str | None]:
    if raw is None:
        return None, None
    unfolded = _FOLDING.sub(" ", raw)
    addresses = simple_address_pairs(unfolded)
    if addresses is None:
        try:
            addresses = email.utils.getaddresses([unfolded])
        except Exception:  # the stdlib address parser has raised on hostile input before
            return None, None
    if not addresses:
        return None, None
    name, address = addresses[0]
    display = decode_header_value(name).strip() if name else ""
    return (display or None), (scrub(address) or None)


def _header_param_safe(part: Message, getter: str) -> str | None:
    try:
        value = getattr(part, getter)()
    except Exception:
        return None
    if value is None:
        return None
    return str(value)


class _Walker:
    """Depth-first over the MIME tree, choosing the first inline text/plain and text/html bodies."""

    def __init__(self) -> None:
        self.text: str | None = None
        self.html: str | None = None
        self.parts: list[MimePart] = []

    def walk(self, part: Message) -> None:
        content_type = _content_type(part)
        disposition = _header_param_safe(part, "get_content_disposition")
        filename = _filename(part)
        if content_type == "message/rfc822":
            # a forwarded message or a digest entry is one attachment, not more body text
            self.parts.append(self._attachment(part, content_type, filename, disposition))
            return
        if part.is_multipart():
            payload = part.get_payload()
            if isinstance(payload, list):
                for child in payload:
                    if isinstance(child, Message):
                        self.walk(child)
            return
        is_body_candidate = disposition != _ATTACHMENT and filename is None
        if is_body_candidate and content_type == "text/html":
            if self.html is None:
                self.html = self._text(part)
            return
        if is_body_candidate and (content_type == "text/plain" or content_type.startswith("multipart/")):
            # a multipart/* leaf is MIME whose boundary is missing: show its text rather than drop it
            if self.text is None:
                self.text = self._text(part)
            return
        if is_body_candidate and content_type.startswith("text/") and disposition is None:
            return  # extra inline text fragments (e.g. text/enriched alternatives) are not attachments
        self.parts.append(self._attachment(part, content_type, filename, disposition))

    @staticmethod
    def _text(part: Message) -> str:
        data = _payload_bytes(part)
        text = scrub(decode_bytes(data, _charset(part)))
        # CRLF is SMTP's line ending, not the author's: JSON consumers get plain newlines
        return text.replace("\r\n", "\n")

    @staticmethod
    def _attachment(part: Message, content_type: str, filename: str | None, disposition: str | None) -> MimePart:
        embedded = content_type == "message/rfc822"
        data = _embedded_message_bytes(part) if embedded else _payload_bytes(part)
        content_id = _raw_header(part, "Content-ID")
        cleaned_id = scrub(content_id.strip().strip("<>").strip()) if content_id else None
        return MimePart(
            content_type=content_type,
            data=data,
            filename=filename,
            content_id=cleaned_id or None,
            disposition=disposition,
        )


def _content_type(part: Message) -> str:
    try:
        return scrub(part.get_content_type().lower())
    except Exception:
        return "application/octet-stream"


def _charset(part: Message) -> str | None:
    """part.get_content_charset(), read without the stdlib's parameter parsing when the Content-Type is a type and
    one `charset` parameter (`_ONE_CHARSET`)."""
    value = part.get("content-type")
    if isinstance(value, str):
        match = _ONE_CHARSET.fullmatch(value)
        if match is not None:
            return match[2].lower()
    return _header_param_safe(part, "get_content_charset")


def _names_a_file(part: Message) -> bool:
    """Whether a Content-Type or Content-Disposition field may hold a `filename` or `name` parameter: each such
    parameter's name (RFC 2231 forms too) holds "name", so without it get_filename and get_param give None."""
    fields = part.raw_items()
    return any(name.lower() in _NAMED_FIELDS and "name" in str(value).lower() for name, value in fields)


def _filename(part: Message) -> str | None:
    if not _names_a_file(part):
        return None
    try:
        raw = part.get_filename() or part.get_param("name", header="content-type")
    except Exception:
        return None
    if raw is None:
        return None
    if isinstance(raw, tuple):  # an RFC 2231 value the stdlib could not collapse
        raw = email.utils.collapse_rfc2231_value(raw)
    name = decode_header_value(str(raw)).strip()
    return name or None


def _payload_bytes(part: Message) -> bytes:
    try:
        data = part.get_payload(decode=True)
    except Exception:
        data = None
    if isinstance(data, bytes):
        return data
    raw = part.get_payload()
    if isinstance(raw, str):
        return raw.encode("utf-8", "surrogateescape")
    return b""


def _embedded_message_bytes(part: Message) -> bytes:
    payload = part.get_payload()
    if isinstance(payload, list) and payload and isinstance(payload[0], Message):
        try:
            return payload[0].as_bytes()
        except Exception:
            try:
                return payload[0].as_string().encode("utf-8", "surrogateescape")
            except Exception:
                return b""
    return _payload_bytes(part)
