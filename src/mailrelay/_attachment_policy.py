"""The attachment policy: which parsed parts are delivered. Pure: no I/O.

Rules, checked per attachment in message order: denied file extension, denied MIME type, MIME type not in the
allowed list, size; then, over the attachments that passed those, the count and the total size. With the action
`drop` a breaking attachment is left out and the message delivered; with `reject` the first one refuses the message.
"""

from __future__ import annotations

import enum
import re
import struct
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mailrelay._errors import AttachmentRejected, AttachmentTooLarge
from mailrelay._parsing import MimePart

# What executables are when their declared type says otherwise: sniffed from the first bytes, checked against the
# type rules like the declared type (so `photo.png` declared image/png but holding a Windows program is caught by
# ALLOWED_TYPES=image/* or DENIED_TYPES=application/x-msdownload).
PE_TYPE = "application/x-msdownload"
ELF_TYPE = "application/x-executable"
MACHO_TYPE = "application/x-mach-binary"
_MACHO_MAGICS = (b"\xfe\xed\xfa\xce", b"\xfe\xed\xfa\xcf", b"\xce\xfa\xed\xfe", b"\xcf\xfa\xed\xfe")
_PE_OFFSET_AT = 0x3C  # MZ header: file offset of the "PE\0\0" signature
_NAME_SEPARATORS = re.compile(r"[\x00/\\]")


class PolicyAction(enum.Enum):
    DROP = "drop"
    REJECT = "reject"


class PolicyRule(enum.Enum):
    """The rule an attachment broke, as logged and as AttachmentRejected.rule."""

    DENIED_EXTENSION = "denied_extension"
    DENIED_TYPE = "denied_type"
    TYPE_NOT_ALLOWED = "type_not_allowed"
    MAX_BYTES = "max_bytes"
    MAX_COUNT = "max_count"
    MAX_TOTAL_BYTES = "max_total_bytes"


@dataclass(frozen=True, slots=True, kw_only=True)
class Dropped:
    part: MimePart
    rule: PolicyRule


@dataclass(frozen=True, slots=True, kw_only=True)
class Screened:
    """The parts to deliver, in message order, and the ones the policy left out."""

    kept: tuple[MimePart, ...]
    dropped: tuple[Dropped, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class AttachmentPolicy:
    """The rules; None or empty means no such rule. Types are lower-case `type/subtype`, `type/*` or `*/*`;
    extensions lower-case without the dot."""

    max_bytes: int
    max_total_bytes: int | None = None
    max_count: int | None = None
    allowed_types: tuple[str, ...] = ()
    denied_types: tuple[str, ...] = ()
    denied_extensions: frozenset[str] = frozenset()
    action: PolicyAction = PolicyAction.DROP

    def screen(self, parts: Sequence[MimePart]) -> Screened:
        """Apply the rules. Raises AttachmentRejected (AttachmentTooLarge for the size rule) for the first
        breaking attachment when the action is `reject`."""
        kept: list[MimePart] = []
        dropped: list[Dropped] = []
        total = 0
        for part in parts:
            rule = self.rule_broken_by(part)
            if rule is None and self.max_count is not None and len(kept) >= self.max_count:
                rule = PolicyRule.MAX_COUNT
            if rule is None and self.max_total_bytes is not None and total + len(part.data) > self.max_total_bytes:
                rule = PolicyRule.MAX_TOTAL_BYTES
            if rule is None:
                kept.append(part)
                total += len(part.data)
                continue
            if self.action is PolicyAction.REJECT:
                raise self._rejection(part, rule)
            dropped.append(Dropped(part=part, rule=rule))
        return Screened(kept=tuple(kept), dropped=tuple(dropped))

    def rule_broken_by(self, part: MimePart) -> PolicyRule | None:
        """The first per-attachment rule `part` breaks (count and total are the caller's), or None."""
        if self.denied_extensions and not self.denied_extensions.isdisjoint(extensions(part.filename)):
            return PolicyRule.DENIED_EXTENSION
        types = [normalize_type(part.content_type)]
        sniffed = sniff_executable(part.data)
        if sniffed is not None:
            types.append(sniffed)
        if any(type_matches(t, self.denied_types) for t in types):
            return PolicyRule.DENIED_TYPE
        if self.allowed_types and not all(type_matches(t, self.allowed_types) for t in types):
            return PolicyRule.TYPE_NOT_ALLOWED
        if len(part.data) > self.max_bytes:
            return PolicyRule.MAX_BYTES
        return None

    def _rejection(self, part: MimePart, rule: PolicyRule) -> AttachmentRejected:
        size = len(part.data)
        if rule is PolicyRule.MAX_BYTES:
            return AttachmentTooLarge(
                filename=part.filename, size=size, limit=self.max_bytes, content_type=part.content_type
            )
        return AttachmentRejected(
            f"attachment breaks the rule {rule.value}",
            rule=rule.value,
            filename=part.filename,
            content_type=part.content_type,
            size=size,
        )


def normalize_type(content_type: str) -> str:
    """`Type/Sub; param=x` -> `type/sub`."""
    return content_type.split(";", 1)[0].strip().lower()


def type_matches(content_type: str, patterns: Iterable[str]) -> bool:
    """Whether a normalized type matches one of the patterns (`type/sub`, `type/*`, `*/*`)."""
    major = content_type.split("/", 1)[0]
    return any(p == content_type or p == "*/*" or (p.endswith("/*") and p[:-2] == major) for p in patterns)


def extensions(filename: str | None) -> set[str]:
    """Every extension of a decoded file name, lower-case: `a.pdf.exe` and `a.exe.pdf` both give {pdf, exe}.

    What a program would cut the name at counts too: a NUL (`a.exe\\0.pdf`), a path separator, an NTFS stream
    suffix (`a.exe::$DATA`), trailing dots and blanks (`a.exe. ` runs as a.exe on Windows).
    """
    if not filename:
        return set()
    found: set[str] = set()
    for piece in _NAME_SEPARATORS.split(unicodedata.normalize("NFKC", filename)):
        piece = piece.split(":", 1)[0].rstrip(". \t")
        for segment in piece.split(".")[1:]:
            segment = segment.strip().lower()
            if segment:
                found.add(segment)
    return found


def sniff_executable(data: bytes) -> str | None:
    """The type of a Windows (PE), Linux (ELF) or macOS (Mach-O) program, by its magic bytes; None otherwise."""
    if data.startswith(b"\x7fELF"):
        return ELF_TYPE
    if data[:4] in _MACHO_MAGICS:
        return MACHO_TYPE
    if data.startswith(b"MZ") and len(data) >= _PE_OFFSET_AT + 4:
        (offset,) = struct.unpack_from("<I", data, _PE_OFFSET_AT)
        if data[offset : offset + 4] == b"PE\x00\x00":
            return PE_TYPE
    return None
