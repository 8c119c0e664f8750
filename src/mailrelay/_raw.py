"""The original message as received (MAIL_RELAY_RAW): inline as base64 under a size cap, or an `.eml` object in S3
under the attachments' prefix, referenced from the payload as `raw_base64` or `raw_url` / `raw_presigned_url`.

The reference is pure data; storing it is the `RawStore` of the mode (`InlineRaw` here, `S3Raw` over `_s3.S3Sink`).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # boto3 (the s3 extra): imported where S3 delivery is built
    from mailrelay._s3 import S3Sink

RAW_FILENAME = "message.eml"
RAW_CONTENT_TYPE = "message/rfc822"
DEFAULT_RAW_INLINE_MAX_BYTES = 512 * 1024  # 683 KiB of base64: the payload still fits NATS' default 1 MB message


@dataclass(frozen=True, slots=True, kw_only=True)
class RawMessage:
    """How the payload points at the original message: its bytes (inline) or its object (S3); None fields are
    omitted from the payload."""

    data: bytes | None = field(default=None, repr=False)
    url: str | None = None
    presigned_url: str | None = None

    def fields(self) -> dict[str, str]:
        """The payload's raw fields, in order: `raw_base64`, or `raw_url` and (with a presign lifetime)
        `raw_presigned_url`. Base64 is encoded here, with the rest of the payload (off the event loop when big)."""
        out: dict[str, str] = {}
        if self.data is not None:
            out["raw_base64"] = base64.b64encode(self.data).decode("ascii")
        if self.url is not None:
            out["raw_url"] = self.url
        if self.presigned_url is not None:
            out["raw_presigned_url"] = self.presigned_url
        return out


class RawStore(Protocol):
    """Keeps the original message of one accepted message for its payload.

    `store` returns the reference, or None when the message is not kept (inline, over the cap); it raises
    AttachmentStoreFailed when the object store fails (the message is then deferred with 451). `discard` removes
    what `store` kept for a message that was finally not posted.
    """

    async def store(self, raw: bytes, *, delivery_id: str) -> RawMessage | None: ...

    async def discard(self, reference: RawMessage) -> None: ...


class InlineRaw:
    """`MAIL_RELAY_RAW=inline`: the message's bytes in the payload, when at most `max_bytes`."""

    def __init__(self, *, max_bytes: int = DEFAULT_RAW_INLINE_MAX_BYTES) -> None:
        self.max_bytes = max_bytes

    async def store(self, raw: bytes, *, delivery_id: str) -> RawMessage | None:
        return RawMessage(data=raw) if len(raw) <= self.max_bytes else None

    async def discard(self, reference: RawMessage) -> None:
        return None


class S3Raw:
    """`MAIL_RELAY_RAW=s3`: the message uploaded as `<prefix><yyyy>/<mm>/<dd>/<uuid4>-message.eml` through `sink`
    (its bucket, prefix, presign lifetime, timeouts and threads), content type `message/rfc822`."""

    def __init__(self, sink: S3Sink) -> None:
        self.sink = sink

    async def store(self, raw: bytes, *, delivery_id: str) -> RawMessage:
        url, presigned = await self.sink.store_object(
            raw, filename=RAW_FILENAME, content_type=RAW_CONTENT_TYPE, delivery_id=delivery_id
        )
        return RawMessage(url=url, presigned_url=presigned)

    async def discard(self, reference: RawMessage) -> None:
        if reference.url is not None:
            await self.sink.discard_urls([reference.url])
