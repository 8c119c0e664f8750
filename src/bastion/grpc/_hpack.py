"""A memo in front of HPACK's Huffman decoder, for the long header values clients repeat on every call.

gRPC clients (grpcio, nghttp2's h2load, Go's) send ``authorization`` as a literal that is never indexed, as
RFC 7541 7.1.3 advises for credentials, so the server decodes the same ~700-byte bearer token on every call.
The ``hpack`` package decodes Huffman in pure Python: about 96 us of the ~415 us a secured unary call cost
(py-spy, ``python -m bench.profile 8 --row grpc-secured``), a quarter of it. Remembering the last few hundred
decoded values of 64 bytes or more (up to 8 KiB each) makes a repeated token a dictionary lookup.

``decode_huffman`` is a pure function of its input, so the memo returns exactly what the decoder would; input
it cannot decode still raises (errors are not remembered). Memory is bounded: 512 entries of at most 8 KiB.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from hpack import hpack as _hpack

MIN_MEMO_BYTES = 64
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
