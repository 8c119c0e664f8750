"""Attachment entries of the payload and where their bytes go: inline base64, or object storage (`_s3.py`).

The attachment policy (which parts are delivered at all) is `_attachment_policy.py`.
"""

from __future__ import annotations

import base64
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

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
    data: bytes | None = field(default=None, repr=False)
    """Inline delivery: the attachment's bytes, base64-encoded only when the payload is encoded (which a big message
    does off the event loop, in a worker process)."""
    url: str | None = None
    presigned_url: str | None = None

    @property
    def data_base64(self) -> str | None:
        return None if self.data is None else base64.b64encode(self.data).decode("ascii")


class AttachmentSink(Protocol):
    """Turns the delivered parts of one message into payload entries, in order.

    `store` raises AttachmentStoreFailed when any part cannot be stored (the message is then not accepted, and
    what was already stored has been removed again); `discard` removes the stored objects of a message that was
    finally not posted; `close` releases the sink's threads at shutdown. All are no-ops for inline delivery.
    """

    async def store(self, parts: Sequence[MimePart], *, delivery_id: str) -> list[Attachment]: ...

    async def discard(self, attachments: Sequence[Attachment]) -> None: ...

    def close(self) -> None: ...


class InlineSink:
    """Delivers attachments inside the payload as base64 (encoded with the payload, see Attachment.data)."""

    async def store(self, parts: Sequence[MimePart], *, delivery_id: str) -> list[Attachment]:
        return [inline_attachment(part) for part in parts]

    async def discard(self, attachments: Sequence[Attachment]) -> None:
        return None

    def close(self) -> None:
        return None


def inline_attachment(part: MimePart) -> Attachment:
    return Attachment(
        content_type=part.content_type,
        size_bytes=len(part.data),
        delivery=DeliveryMode.INLINE,
        filename=part.filename,
        content_id=part.content_id,
        data=part.data,
    )
