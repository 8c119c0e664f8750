"""The inline sink and the attachment entry."""

from __future__ import annotations

import base64

from mailrelay._attachments import DeliveryMode, InlineSink, inline_attachment
from mailrelay._parsing import MimePart


def test_inline_attachment_entry() -> None:
    entry = inline_attachment(MimePart(content_type="text/csv", data=b"a,b\n", filename="d.csv"))
    assert entry.delivery is DeliveryMode.INLINE
    assert entry.size_bytes == 4
    assert base64.b64decode(entry.data_base64 or "") == b"a,b\n"
    assert entry.url is None


async def test_inline_sink_stores_in_order_and_discards_nothing() -> None:
    parts = [MimePart(content_type="image/png", data=b"png", content_id="x@y"), MimePart(content_type="a/b", data=b"")]
    sink = InlineSink()
    entries = await sink.store(parts, delivery_id="d")
    assert entries == [inline_attachment(part) for part in parts]
    assert await sink.discard(entries) is None
