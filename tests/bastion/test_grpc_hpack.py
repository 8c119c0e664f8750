"""HPACK for gRPC connections: the memo decoder on Bastion's own connections only (its assumptions and bounds:
tests/bastion/compat/test_hpack.py) and the answer encoder (the request id as a literal without indexing)."""

from __future__ import annotations

import pytest
import structlog
from h2.config import H2Configuration
from h2.connection import H2Connection
from hpack import Decoder, Encoder
from hpack import hpack as hpack_module
from hpack.huffman_table import decode_huffman

from bastion._compat import hpack as hpack_compat
from bastion._compat.hpack import MemoDecoder, decode_huffman_memoized
from bastion.grpc import _hpack

TOKEN = b"Bearer " + b"eyJhbGciOiJSUzI1NiJ9." * 30


def test_a_connection_decodes_through_the_memo_and_others_do_not() -> None:
    """The memo is set on Bastion's own h2 connections only: hpack's decoder elsewhere is untouched."""
    headers = [(b":method", b"POST"), (b"authorization", TOKEN), (b"te", b"trailers")]
    block = Encoder().encode([(name, value, True) for name, value in headers])  # never indexed, as clients send it
    h2 = H2Connection(H2Configuration(client_side=False))
    _hpack.use_memo_decoder(h2)
    assert isinstance(h2.decoder, MemoDecoder)
    before = decode_huffman_memoized.cache_info().hits  # type: ignore[attr-defined]
    for _ in range(3):
        assert [(h[0], h[1]) for h in h2.decoder.decode(block, raw=True)] == headers
    assert decode_huffman_memoized.cache_info().hits >= before + 2  # type: ignore[attr-defined]
    assert type(H2Connection(H2Configuration(client_side=False)).decoder) is Decoder
    assert hpack_module.decode_huffman is decode_huffman  # no process-wide patch


def test_the_memo_is_unavailable_without_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hpack_compat, "supported", lambda: False)
    with structlog.testing.capture_logs() as logs:
        assert not _hpack.memo_decoder_available()
    assert [log["event"] for log in logs] == ["memo_decoder_unavailable"]
    assert logs[0]["hpack"] == hpack_compat.version()


def test_the_memo_is_available_on_the_installed_hpack() -> None:
    assert _hpack.memo_decoder_available()


def test_the_request_id_is_sent_as_it_is_and_never_enters_the_table() -> None:
    encoder, decoder = _hpack.ResponseEncoder(), Decoder()
    for n in range(200):
        rid = b"%032x" % n
        headers = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"x-request-id", rid)]
        block = encoder.encode(headers)
        # RFC 7541 6.2.2, literal without indexing, new name: 0x00, then name and value without Huffman.
        assert block.endswith(b"\x00\x0cx-request-id\x20" + rid)
        assert [(h[0], h[1]) for h in decoder.decode(block, raw=True)] == headers
        assert encoder.header_table.dynamic_entries == decoder.header_table.dynamic_entries
    # Only content-type was worth remembering; 200 request ids would have pushed it out.
    assert list(encoder.header_table.dynamic_entries) == [(b"content-type", b"application/grpc")]


def test_a_long_request_id_gets_a_multi_byte_length() -> None:
    rid = b"r" * 200  # longer than a sane id; the encoding must still be right (RFC 7541 5.1)
    block = _hpack.ResponseEncoder().encode([(b"x-request-id", rid)])
    assert [(h[0], h[1]) for h in Decoder().decode(block, raw=True)] == [(b"x-request-id", rid)]
