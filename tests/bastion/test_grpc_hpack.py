"""HPACK for gRPC connections: the memo in front of the Huffman decoder (the same bytes as the decoder, errors
still raised, bounded) and the answer encoder (the request id as a literal without indexing)."""

from __future__ import annotations

import pytest
from hpack import Decoder, Encoder
from hpack.exceptions import HPACKDecodingError
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
from hpack.huffman_table import decode_huffman

from bastion.grpc import _hpack

ENCODER = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH)
TOKEN = b"Bearer " + b"eyJhbGciOiJSUzI1NiJ9." * 30


def test_same_bytes_as_the_decoder_and_a_repeat_is_remembered() -> None:
    memo = _hpack.memoized(decode_huffman)
    encoded = ENCODER.encode(TOKEN)
    assert memo(encoded) == TOKEN == decode_huffman(encoded)
    assert memo(memoryview(encoded)) == TOKEN  # what hpack passes may be a memoryview
    info = memo.cache_info()  # type: ignore[attr-defined]
    assert (info.hits, info.misses) == (1, 1)


@pytest.mark.parametrize("value", [b"", b"short", b"x" * 20_000])
def test_short_and_huge_values_are_decoded_not_remembered(value: bytes) -> None:
    memo = _hpack.memoized(decode_huffman)
    encoded = ENCODER.encode(value)
    assert memo(encoded) == value
    assert memo(encoded) == value
    assert memo.cache_info().currsize == 0  # type: ignore[attr-defined]


def test_undecodable_input_still_raises_every_time() -> None:
    memo = _hpack.memoized(decode_huffman)
    garbage = b"\xff" * 100  # an EOS symbol inside the string: RFC 7541 5.2 says it is an error
    for _ in range(2):
        with pytest.raises(HPACKDecodingError):
            memo(garbage)


def test_bounded() -> None:
    memo = _hpack.memoized(decode_huffman)
    for n in range(_hpack.MEMO_ENTRIES + 50):
        memo(ENCODER.encode(b"token-%d-" % n + b"a" * 200))
    assert memo.cache_info().currsize == _hpack.MEMO_ENTRIES  # type: ignore[attr-defined]


def test_install_is_idempotent_and_decoding_headers_is_unchanged() -> None:
    _hpack.install()
    _hpack.install()
    from hpack import hpack as module

    assert module.decode_huffman.wrapped is decode_huffman  # type: ignore[attr-defined]
    headers = [(b":method", b"POST"), (b"authorization", TOKEN), (b"te", b"trailers")]
    block = Encoder().encode([(name, value, True) for name, value in headers])  # never indexed, as clients send it
    decoder = Decoder()
    for _ in range(3):
        assert [(h[0], h[1]) for h in decoder.decode(block, raw=True)] == headers


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
