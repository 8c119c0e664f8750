"""What ``bastion._compat.hpack`` assumes of hpack's internals, checked on the installed version (verified on
hpack 4.2.0, h2 4.4.1): an upgrade that changes one fails here, by name.

Assumptions:

- ``hpack.hpack.Decoder._decode_literal(data, should_index)`` decodes every literal field of ``Decoder.decode``
  and returns ``(header, consumed)``; ``MemoDecoder`` overrides it and decodes exactly as hpack does.
- h2's ``H2Connection.decoder`` is an ``hpack.Decoder`` that can be replaced before the first header block.
"""

from __future__ import annotations

import hpack
import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from hpack import Decoder, Encoder
from hpack.exceptions import HPACKDecodingError, OversizedHeaderListError
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
from hpack.huffman_table import decode_huffman

from bastion._compat import hpack as hpack_compat

ENCODER = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH)
TOKEN = b"Bearer " + b"eyJhbGciOiJSUzI1NiJ9." * 30
BLOCKS = [
    [(b":method", b"POST"), (b":path", b"/svc/Method"), (b"authorization", TOKEN), (b"te", b"trailers")],
    [(b":method", b"POST"), (b"x-custom", b"v" * 40), (b"authorization", TOKEN), (b"grpc-timeout", b"5S")],
    [(b"x-custom", b"v" * 40), (b"x-empty", b""), (b"content-type", b"application/grpc")],
]


def test_the_version_is_one_verified() -> None:
    """4.2.0: the newest (`make test`); 4.1.0 and 4.0.0: `make compat`'s middle and oldest sets. The memo decoder's
    hook is on each."""
    assert hpack.__version__ in {"4.2.0", "4.1.0", "4.0.0"}, (
        "re-check bastion/_compat/hpack.py against this hpack, then update"
    )


def test_the_hook_is_there() -> None:
    assert hpack_compat.supported()
    assert {"_decode_literal"} == hpack_compat.PRIVATE_NAMES


@pytest.mark.parametrize("huffman", [True, False], ids=["huffman", "plain"])
@pytest.mark.parametrize("sensitive", [True, False], ids=["never-indexed", "indexed"])
def test_the_memo_decoder_decodes_as_hpack_does(huffman: bool, sensitive: bool) -> None:
    encoder = Encoder()
    ours, theirs = hpack_compat.MemoDecoder(), Decoder()
    for block in BLOCKS * 2:  # the second round hits the dynamic table and the memo
        encoded = encoder.encode([(name, value, sensitive) for name, value in block], huffman=huffman)
        assert ours.decode(encoded, raw=True) == theirs.decode(encoded, raw=True)
        assert [type(header) for header in ours.decode(encoded, raw=True)] == [
            type(header) for header in theirs.decode(encoded, raw=True)
        ]  # NeverIndexedHeaderTuple kept
        assert ours.header_table.dynamic_entries == theirs.header_table.dynamic_entries


@pytest.mark.parametrize(
    "block",
    [
        pytest.param(b"\x00\x85ab", id="truncated-name"),
        pytest.param(b"\x00\x01a\x85ab", id="truncated-value"),
        pytest.param(b"\x00\x01a\x8a" + b"\xff" * 10, id="bad-huffman"),
    ],
)
def test_a_block_hpack_refuses_is_refused_alike(block: bytes) -> None:
    with pytest.raises(HPACKDecodingError):
        Decoder().decode(block)
    with pytest.raises(HPACKDecodingError):
        hpack_compat.MemoDecoder().decode(block)


def test_an_h2_connection_takes_the_memo_decoder_with_its_limits() -> None:
    h2 = H2Connection(H2Configuration(client_side=False))
    limit = h2.decoder.max_header_list_size
    hpack_compat.use_memo_decoder(h2)
    assert isinstance(h2.decoder, hpack_compat.MemoDecoder)
    assert h2.decoder.max_header_list_size == limit
    with pytest.raises(OversizedHeaderListError):
        h2.decoder.decode(Encoder().encode([(b"x", b"y" * (limit + 1))]))


def test_same_bytes_as_the_decoder_and_a_repeat_is_remembered() -> None:
    memo = hpack_compat.memoized(decode_huffman)
    encoded = ENCODER.encode(TOKEN)
    assert memo(encoded) == TOKEN == decode_huffman(encoded)
    assert memo(memoryview(encoded)) == TOKEN  # what hpack passes may be a memoryview
    info = memo.cache_info()  # type: ignore[attr-defined]
    assert (info.hits, info.misses) == (1, 1)


@pytest.mark.parametrize("value", [b"", b"short", b"x" * 20_000])
def test_short_and_huge_values_are_decoded_not_remembered(value: bytes) -> None:
    memo = hpack_compat.memoized(decode_huffman)
    encoded = ENCODER.encode(value)
    assert memo(encoded) == value
    assert memo(encoded) == value
    assert memo.cache_info().currsize == 0  # type: ignore[attr-defined]


def test_undecodable_input_still_raises_every_time() -> None:
    memo = hpack_compat.memoized(decode_huffman)
    garbage = b"\xff" * 100  # an EOS symbol inside the string: RFC 7541 5.2 says it is an error
    for _ in range(2):
        with pytest.raises(HPACKDecodingError):
            memo(garbage)


def test_bounded() -> None:
    memo = hpack_compat.memoized(decode_huffman)
    for n in range(hpack_compat.MEMO_ENTRIES + 50):
        memo(ENCODER.encode(b"token-%d-" % n + b"a" * 200))
    assert memo.cache_info().currsize == hpack_compat.MEMO_ENTRIES  # type: ignore[attr-defined]
