"""Reply stripping for payload v2: the sender's reply without the quoted history and without the signature.

Pure and linear in the size of the text: every line is looked at a bounded number of times and only its first
MARKER_SCAN_CHARS characters are matched against the markers, so a megabyte without a line break or thousands of
nested `>` cost what reading them costs.

The history starts at the first quote header (`On ... wrote:` and its translations, Outlook's `-----Original
Message-----` or `From:`/`Sent:` block, a forwarded-message line); without one, `>`-quoted lines are dropped
wherever they are (inline replies keep the sender's answers). The signature is what follows the last RFC 3676
`-- ` line of the reply, or failing that a mobile client footer (`Sent from my iPhone`, ...) near its end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MARKER_SCAN_CHARS = 300  # characters of a line matched against the markers (quote headers are shorter)
HEADER_JOIN_LINES = 3  # a client may wrap its `On ... wrote:` line: up to this many lines are read as one
OUTLOOK_BLOCK_LINES = 5  # Outlook's From:/Sent:/To:/Subject: block: `Sent:` (or `Date:`) within this many lines
MAX_CANDIDATES = 1000  # lines that look like a quote header's part checked in full; past it the rest is the reply
FOOTER_SEARCH_LINES = 4  # a mobile footer counts as the signature among the last this many non-blank lines
PLAIN_TAIL_LINES = 8  # lines split off the end of a text without quotes to look for that footer
# RFC 3676 4.3's "-- " (many clients drop the trailing space; html2text writes it as "\--")
SIGNATURE_DELIMITERS = frozenset({"--", "\\--"})

_VERBS = r"(?:wrote|schrieb|a\ écrit|escribió|schreef|ha\ scritto|escreveu|skrev|napisał|napsal)"
_WROTE = re.compile(  # the verb may be followed by the name (German, Dutch); Yahoo puts the quote on the same line
    rf"""^\s*(?:On|Am|Le|El|Op|Il|Em|Den|W\ dniu|Dne)\b.{{0,260}}?\b{_VERBS}\b[^:]{{0,150}}:(?:\s*$|\s{{2,}})""",
    re.IGNORECASE | re.VERBOSE,
)
_WROTE_LOOSE = re.compile(  # "John Smith wrote:" alone: a header only when quoted lines follow
    rf"^.{{0,200}}?\b{_VERBS}\b[^:]{{0,150}}:\s*$", re.IGNORECASE | re.VERBOSE
)
_CANDIDATE = re.compile(  # a line that may be (the end of) a quote header: a verb, a rule, a field name, a phrase
    rf"{_VERBS}|^\s*[-_*]|^\s*\w{{1,12}}\s?:|forwarded|weitergeleitet|réexpédié|reenviado", re.IGNORECASE | re.VERBOSE
)
_ORIGINAL = re.compile(
    r"""^\s*(?:
        -{2,}\s*(?:Original\ Message|Ursprüngliche\ Nachricht|Message\ d'origine|Mensaje\ original
                  |Oorspronkelijk\ bericht|Messaggio\ originale|Mensagem\ original|Forwarded\ message
                  |Weitergeleitete\ Nachricht|Message\ transféré|Mensaje\ reenviado)\s*-{2,}
      | Begin\ forwarded\ message:
      | Anfang\ der\ weitergeleiteten\ Nachricht:
      | Début\ du\ message\ réexpédié\ :?
      | Inicio\ del\ mensaje\ reenviado:
    )\s*$""",
    re.IGNORECASE | re.VERBOSE,
)
_FROM_FIELD = re.compile(r"^\s*\*?(?:From|Von|De|Van|Da|Från|Od)\s?:\*?\s", re.IGNORECASE)
_SENT_FIELD = re.compile(
    r"^\s*\*?(?:Sent|Date|Gesendet|Datum|Envoyé|Enviado|Enviada|Verzonden|Inviato|Data|Skickat|Wysłano)\s?:",
    re.IGNORECASE,
)
# A line whose first non-blank is "-" (the first line, another line): with ":", all _history_start looks at.
# `[^\S\n]` keeps each match on its own line (linear on a megabyte of blank lines); a search starting with a
# literal "\n" is a fast scan where a MULTILINE "^" is tried at every character.
_FIRST_LINE_DASH = re.compile(r"[^\S\n]*-")
_LINE_DASH = re.compile(r"\n[^\S\n]*-")
_RULE = re.compile(r"^\s*_{10,}\s*$")
_FOOTER_PHRASES = (  # each starts with a letter (see _FOOTER_INITIAL)
    r"Sent\ from\ (?:my\ |Mail\ for\ |Yahoo\ Mail|Outlook|AOL)",
    r"Sent\ via\ ",
    r"Get\ Outlook\ for\ ",
    r"Sent\ with\ (?:ProtonMail|Proton\ Mail)",
    r"Von\ meinem\ .{1,60}\ gesendet",
    r"Gesendet\ von\ (?:meinem|Outlook|Mail\ für)",
    r"Von\ Outlook\ für",
    r"Envoyé\ (?:de|depuis)\ (?:mon|ma|Outlook|Yahoo)",
    r"Obtenir\ Outlook\ pour",
    r"Enviado\ (?:desde|do|de)\ (?:mi|meu|o\ meu|Outlook|Yahoo)",
    r"Obtener\ Outlook\ para",
    r"Verstuurd\ (?:vanaf|met)\ ",
    r"Inviato\ da\ ",
    r"Skickat\ från\ ",
    r"Wysłane\ z\s",
)
_FOOTER = re.compile(rf"^\s*(?:{'|'.join(_FOOTER_PHRASES)})", re.IGNORECASE | re.VERBOSE)
# A line whose first non-blank is no phrase's first letter (most lines) is no footer: one short match decides
_INITIALS = "".join(sorted({phrase[0] for phrase in _FOOTER_PHRASES}))
_FOOTER_INITIAL = re.compile(rf"\s*[{_INITIALS}]", re.IGNORECASE)
# A line whose first non-blank is "-" or a footer's first letter: without one (and without ":", ">" and "\\") the
# whole text is the reply (_unmarked); same shape and cost as _FIRST_LINE_DASH and _LINE_DASH
_FIRST_LINE_MARK = re.compile(rf"[^\S\n]*[-{_INITIALS}]", re.IGNORECASE)
_LINE_MARK = re.compile(rf"\n[^\S\n]*[-{_INITIALS}]", re.IGNORECASE)


@dataclass(frozen=True, slots=True, kw_only=True)
class StrippedReply:
    """`text`: the reply alone, trimmed ("" when nothing is left); `signature`: the signature, or None."""

    text: str
    signature: str | None = None


def strip_reply(body: str) -> StrippedReply:
    """Split `body` into the reply, its signature and the quoted history (dropped). Never raises."""
    text, signature = reply_parts(body)
    return StrippedReply(text=text, signature=signature)


def reply_parts(body: str) -> tuple[str, str | None]:
    """`strip_reply`'s text and signature without the object (payload v2 writes them into its dictionary)."""
    text = body.replace("\r\n", "\n").replace("\r", "\n") if "\r" in body else body
    if ":" not in text and ">" not in text and "\\" not in text and _unmarked(text):
        return text.strip(), None  # the usual reply: no header, quote, delimiter or footer line can be in it
    # no `>`, no line starting with "-" and no backslash (a `\--` line): no quote and no delimiter line
    plain = _plain_reply(text) if ">" not in text and "\\" not in text and not _may_have_header(text) else None
    if plain is not None:
        return plain
    lines = text.split("\n")
    # Whole-text checks first (one C scan each): most replies have no quote header, no `>` and no delimiter
    start, header_end = _history_start(lines) if _may_have_header(text) else (len(lines), len(lines))
    reply = lines[:start]
    if not any(line.strip() for line in reply):
        reply = lines[header_end:]  # bottom-posted: the quote comes first, the answer after it
    if ">" in text:
        reply = [line for line in reply if not line.lstrip().startswith(">")]
    cut = _signature_start(reply, delimited="--" in text)
    signature = "\n".join(reply[cut:]).strip() if cut is not None else ""
    text = "\n".join(reply[:cut] if cut is not None else reply).strip()
    if cut is not None and _is_delimiter(reply[cut]):
        signature = "\n".join(reply[cut + 1 :]).strip()
    return text, signature or None


def _plain_reply(text: str) -> tuple[str, str | None] | None:
    """`strip_reply` of a text without a quote header, a `>` or a delimiter line: all of it is the reply, and only
    a mobile footer among its last non-blank lines can start a signature. Only the last PLAIN_TAIL_LINES lines are
    split off; None when they do not decide (blank lines at the end): then the general code reads all lines."""
    tail = text.rsplit("\n", PLAIN_TAIL_LINES)  # tail[0]: the rest of the text, one line or more
    whole = len(tail) <= PLAIN_TAIL_LINES  # tail[0] is one line too
    seen = 0
    for index in range(len(tail) - 1, -1 if whole else 0, -1):
        head = tail[index][:MARKER_SCAN_CHARS].rstrip()  # _head
        if not head:
            continue
        if _FOOTER_INITIAL.match(head) and _FOOTER.match(head):
            signature = "\n".join(tail[index:]).strip()
            return "\n".join(tail[:index]).strip(), signature or None
        seen += 1
        if seen >= FOOTER_SEARCH_LINES:
            return text.strip(), None
    return (text.strip(), None) if whole else None


def _unmarked(text: str) -> bool:
    """True when no line starts (after blanks) with "-" or a mobile footer's first letter: with no ":", ">" or
    backslash either, the whole text is the reply and there is no signature (`_plain_reply` would find none)."""
    return _FIRST_LINE_MARK.match(text) is None and _LINE_MARK.search(text) is None


def _may_have_header(text: str) -> bool:
    """False when no line has ":" or starts (after blanks) with "-": _history_start would find nothing."""
    return ":" in text or _FIRST_LINE_DASH.match(text) is not None or _LINE_DASH.search(text) is not None


def _head(line: str) -> str:
    return line[:MARKER_SCAN_CHARS].rstrip()


def _history_start(lines: list[str]) -> tuple[int, int]:
    """Where the quoted history starts (a rule line just above its header belongs to it) and where its header
    ends; (len(lines), len(lines)) without one. Only lines a cheap test marks as candidates are matched in full,
    and only the first MAX_CANDIDATES of them."""
    candidates = 0
    for index, line in enumerate(lines):
        head = _head(line)
        lead = head.lstrip()[:1]
        if lead == ">" or (lead != "-" and ":" not in head) or not _CANDIDATE.search(head):
            continue  # every header line ends in ":" or is a dashed line; quoted lines are dropped anyway
        candidates += 1
        if candidates > MAX_CANDIDATES:
            break
        for first in range(max(index - HEADER_JOIN_LINES + 1, 0), index + 1):  # a wrapped header's verb is last
            span = _header_span(lines, first)
            if span:
                return _rule_above(lines, first), first + span
    return len(lines), len(lines)


def _header_span(lines: list[str], index: int) -> int:
    head = _head(lines[index])
    if _ORIGINAL.match(head) or _outlook_block(lines, index):
        return 1
    return _wrote_header(lines, index)


def _rule_above(lines: list[str], index: int) -> int:
    previous = index - 1
    while previous >= 0 and not lines[previous].strip():
        previous -= 1
    return previous if previous >= 0 and _RULE.match(_head(lines[previous])) else index


def _wrote_header(lines: list[str], index: int) -> int:
    """How many lines the `On ... wrote:` header starting here spans (it may be wrapped over up to
    HEADER_JOIN_LINES), 0 when there is none; a looser `... wrote:` line only counts when `>`-quoted text follows
    (a sentence of the reply ending in "wrote:" is not a header)."""
    joined = ""
    for offset in range(HEADER_JOIN_LINES):
        if index + offset >= len(lines):
            return 0
        joined = f"{joined} {_head(lines[index + offset]).strip()}".strip()
        if len(joined) > MARKER_SCAN_CHARS:
            return 0
        if _WROTE.match(joined):
            return offset + 1
        if offset == 0 and _WROTE_LOOSE.match(joined) and _quote_follows(lines, index + 1):
            return 1
    return 0


def _quote_follows(lines: list[str], start: int) -> bool:
    for line in lines[start : start + 3]:
        if line.strip():
            return line.lstrip().startswith(">")
    return False


def _outlook_block(lines: list[str], index: int) -> bool:
    if not _FROM_FIELD.match(_head(lines[index])):
        return False
    return any(_SENT_FIELD.match(_head(line)) for line in lines[index + 1 : index + OUTLOOK_BLOCK_LINES])


def _is_delimiter(line: str) -> bool:
    return len(line) <= 6 and line.rstrip() in SIGNATURE_DELIMITERS


def _signature_start(reply: list[str], *, delimited: bool = True) -> int | None:
    """Index of the last `-- ` line, else of a mobile footer among the last non-blank lines, else None.
    `delimited` False: the text has no `--`, so no delimiter line either."""
    for index in range(len(reply) - 1 if delimited else -1, -1, -1):
        if _is_delimiter(reply[index]):
            return index
    seen = 0
    for index in range(len(reply) - 1, -1, -1):
        head = _head(reply[index])
        if not head.strip():
            continue
        if _FOOTER_INITIAL.match(head) and _FOOTER.match(head):
            return index
        seen += 1
        if seen >= FOOTER_SEARCH_LINES:
            return None
    return None
