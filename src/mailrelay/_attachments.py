"""Attachment handling: size cap, policy filter and delivery sink (inline base64 today, S3 later).

`AttachmentPolicy` and `AttachmentSink` are the seams for the later attachment-policy and S3
issue; this module ships only the inline sink and an allow-all policy.
"""

from __future__ import annotations

import base64
import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from mailrelay._errors import AttachmentTooLarge
from mailrelay._parsing import MimePart


class DeliveryMode(enum.Enum):
    INLINE = "inline"
    S3 = "s3"


@dataclass(frozen=True, slots=True, kw_only=True)
class Attachment:
    """One attachment entry of the payload (spec: "Attachment entry"); None fields are omitted."""

    content_type: str
    size_bytes: int
    delivery: DeliveryMode
    filename: str | None = None
    content_id: str | None = None
    data_base64: str | None = None
    url: str | None = None
    presigned_url: str | None = None


class AttachmentPolicy(Protocol):
    """Decides which parsed parts are delivered at all (seam for the attachment-policy issue)."""

    def allows(self, part: MimePart) -> bool: ...


class AttachmentSink(Protocol):
    """Turns an allowed part into a payload entry: inline base64 here, an S3 upload later."""

    async def store(self, part: MimePart, *, delivery_id: str, index: int) -> Attachment: ...


class AllowAll:
    """The default policy: every part is delivered."""

    def allows(self, part: MimePart) -> bool:
        return True


class InlineSink:
    """Delivers attachments inside the payload as base64."""

    async def store(self, part: MimePart, *, delivery_id: str, index: int) -> Attachment:
        return inline_attachment(part)


def inline_attachment(part: MimePart) -> Attachment:
    return Attachment(
        content_type=part.content_type,
        size_bytes=len(part.data),
        delivery=DeliveryMode.INLINE,
        filename=part.filename,
        content_id=part.content_id,
        data_base64=base64.b64encode(part.data).decode("ascii"),
    )


def check_sizes(parts: Iterable[MimePart], *, limit: int) -> None:
    """Raise AttachmentTooLarge for the first part whose decoded size is above `limit`."""
    for part in parts:
        if len(part.data) > limit:
            raise AttachmentTooLarge(filename=part.filename, size=len(part.data), limit=limit)
