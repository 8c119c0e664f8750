"""Attachment size cap and the inline sink."""

from __future__ import annotations

import base64

import pytest

from mailrelay._attachments import AllowAll, DeliveryMode, InlineSink, check_sizes, inline_attachment
from mailrelay._errors import AttachmentTooLarge
from mailrelay._parsing import MimePart


def test_parts_at_the_limit_pass_and_above_raise() -> None:
    check_sizes([MimePart(content_type="a/b", data=b"x" * 10)], limit=10)
    with pytest.raises(AttachmentTooLarge) as caught:
        check_sizes([MimePart(content_type="a/b", data=b"x" * 11, filename="big.bin")], limit=10)
    assert (caught.value.filename, caught.value.size, caught.value.limit) == ("big.bin", 11, 10)


def test_inline_attachment_entry() -> None:
    entry = inline_attachment(MimePart(content_type="text/csv", data=b"a,b\n", filename="d.csv"))
    assert entry.delivery is DeliveryMode.INLINE
    assert entry.size_bytes == 4
    assert base64.b64decode(entry.data_base64 or "") == b"a,b\n"
    assert entry.url is None


async def test_inline_sink_and_allow_all_policy() -> None:
    part = MimePart(content_type="image/png", data=b"png", content_id="x@y")
    assert AllowAll().allows(part)
    entry = await InlineSink().store(part, delivery_id="d", index=0)
    assert entry == inline_attachment(part)
