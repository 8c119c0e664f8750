"""HPACK for Bastion's gRPC connections: a memo in front of the Huffman decoder, an encoder for the request id.

**Decoding.** A memo in front of HPACK's Huffman decoder, for the long header values clients repeat on every call.

gRPC clients (grpcio, nghttp2's h2load, Go's) send ``authorization`` as a literal that is never indexed, as
RFC 7541 7.1.3 advises for credentials, so the server decodes the same ~700-byte bearer token on every call.
The ``hpack`` package decodes Huffman in pure Python: about 96 us of the ~415 us a secured unary call cost
(py-spy, ``python -m bench.profile 8 --row grpc-secured``), a quarter of it. Remembering the last few hundred
decoded values of 16 bytes or more (up to 8 KiB each) makes a repeated token (or a `:path` that nghttp2
clients never index) a dictionary lookup.

``decode_huffman`` is a pure function of its input, so the memo returns exactly what the decoder would; input
it cannot decode still raises (errors are not remembered). Memory is bounded: 512 entries of at most 8 KiB.

**Encoding.** Every answer carries a new ``x-request-id``. ``hpack``'s encoder would Huffman-encode each one in
pure Python and add it to the connection's dynamic table, where it is never used again but pushes out the
entries that are (and the encoder searches that table linearly for every header it sends). ``ResponseEncoder``
sends the id as a literal without indexing (RFC 7541 6.2.2), its name and value as they are: the bytes are
a handful longer, the table keeps the headers that repeat, and no Huffman code runs for it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from hpack import hpack as _hpack
from hpack.hpack import INDEX_NONE, Encoder, encode_integer

MIN_MEMO_BYTES = 16
MAX_MEMO_BYTES = 8 * 1024
MEMO_ENTRIES = 512


def memoized(decode: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """``decode`` with values of MIN_MEMO_BYTES..MAX_MEMO_BYTES remembered (LRU, MEMO_ENTRIES)."""
    remembered = functools.lru_cache(maxsize=MEMO_ENTRIES)(decode)

    def decode_huffman(huffman_string: Any) -> bytes:
        if huffman_string is None or not MIN_MEMO_BYTES <= len(huffman_string) <= MAX_MEMO_BYTES:
            return decode(huffman_string)
        return remembered(bytes(huffman_string))

    decode_huffman.cache_info = remembered.cache_info  # type: ignore[attr-defined]
    decode_huffman.wrapped = decode  # type: ignore[attr-defined]
    return decode_huffman


def install() -> None:
    """Put the memo in front of ``hpack``'s decoder (once per process; idempotent)."""
    current = getattr(_hpack, "decode_huffman", None)
    if current is not None and getattr(current, "wrapped", None) is None:
        setattr(_hpack, "decode_huffman", memoized(current))  # noqa: B010  # the module's own name, replaced


REQUEST_ID = b"x-request-id"
_REQUEST_ID_LITERAL = INDEX_NONE + bytes(encode_integer(len(REQUEST_ID), 7)) + REQUEST_ID


class ResponseEncoder(Encoder):
    """``hpack.Encoder`` that sends ``x-request-id`` as a literal without indexing (see the module's doc)."""

    def add(self, to_add: tuple[bytes, bytes], sensitive: bool, huffman: bool = False) -> bytes:
        name, value = to_add
        if name == REQUEST_ID:
            return _REQUEST_ID_LITERAL + bytes(encode_integer(len(value), 7)) + value
        return super().add(to_add, sensitive, huffman)
