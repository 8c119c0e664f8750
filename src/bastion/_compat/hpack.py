"""hpack internals Bastion relies on (verified on hpack 4.2.0, with h2 4.4.1; `make compat`: 4.1.0 and 4.0.0).

Bastion's gRPC connections decode headers with :class:`MemoDecoder`, set on each connection's h2 state machine
through its public ``decoder`` attribute (``use_memo_decoder``): nothing changes for any other hpack or h2 user
in the process.

- ``hpack.hpack.Decoder._decode_literal(data, should_index)``: decodes one literal field (indexed or literal
  name, length-prefixed value, either Huffman-coded), adds it to the dynamic table when ``should_index``, and
  returns ``(header, consumed)``; ``Decoder.decode`` calls it for every literal field.
  :class:`MemoDecoder` overrides it with the same steps, the Huffman strings decoded through a memo.

``supported()`` says whether the installed hpack has the hook; without it the connections keep h2's own
decoder (the memo is a fast path, nothing depends on it). ``tests/bastion/compat/test_hpack.py`` checks it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
from collections.abc import Callable
from typing import Any

from h2.connection import H2Connection
from hpack.exceptions import HPACKDecodingError
from hpack.hpack import Decoder, decode_integer
from hpack.huffman_table import decode_huffman
from hpack.struct import HeaderTuple, NeverIndexedHeaderTuple

VERIFIED = "hpack 4.2.0"
"""The hpack version these assumptions were last checked on."""
MIN_MEMO_BYTES = 16
MAX_MEMO_BYTES = 8 * 1024
MEMO_ENTRIES = 512
HOOK = "_decode_literal"
"""The private method of ``hpack.hpack.Decoder`` that :class:`MemoDecoder` overrides."""
PRIVATE_NAMES = frozenset({HOOK})
"""Every private name of hpack this module touches (the wall test looks for them outside ``bastion._compat``)."""


def memoized(decode: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """``decode`` with values of MIN_MEMO_BYTES..MAX_MEMO_BYTES remembered (LRU, MEMO_ENTRIES); ``decode`` must be a
    pure function of its input (errors are not remembered: input it cannot decode raises every time)."""
    remembered = functools.lru_cache(maxsize=MEMO_ENTRIES)(decode)

    def decode_memoized(huffman_string: Any) -> bytes:
        if not MIN_MEMO_BYTES <= len(huffman_string) <= MAX_MEMO_BYTES:
            return decode(huffman_string)
        return remembered(bytes(huffman_string))

    decode_memoized.cache_info = remembered.cache_info  # type: ignore[attr-defined]
    return decode_memoized


decode_huffman_memoized = memoized(decode_huffman)


def version() -> str:
    """The installed hpack's version."""
    return importlib.metadata.version("hpack")


def supported() -> bool:
    """Whether ``Decoder._decode_literal(data, should_index)`` exists as :class:`MemoDecoder` assumes."""
    hook = getattr(Decoder, HOOK, None)
    if not callable(hook):
        return False
    return list(inspect.signature(hook).parameters) == ["self", "data", "should_index"]


class MemoDecoder(Decoder):
    """``hpack.Decoder`` whose Huffman strings go through a memo (the same output; see ``bastion.grpc._hpack``)."""

    def _decode_literal(self, data: bytes | memoryview, should_index: bool) -> tuple[HeaderTuple, int]:
        # hpack 4.2.0's Decoder._decode_literal with decode_huffman_memoized for decode_huffman (and no debug log).
        if isinstance(data, memoryview):
            data = data.tobytes()
        if should_index:
            indexed_name = data[0] & 0x3F
            name_len = 6
            not_indexable = False
        else:
            high_byte = data[0]
            indexed_name = high_byte & 0x0F
            name_len = 4
            not_indexable = bool(high_byte & 0x10)
        if indexed_name:
            index, consumed = decode_integer(data, name_len)
            name = self.header_table.get_by_index(index)[0]
            total_consumed = consumed
            length = 0
        else:
            data = data[1:]  # the first byte was consumed
            length, consumed = decode_integer(data, 7)
            name = data[consumed : consumed + length]
            if len(name) != length:
                raise HPACKDecodingError("Truncated header block")
            if data[0] & 0x80:
                name = decode_huffman_memoized(name)
            total_consumed = consumed + length + 1
        data = data[consumed + length :]
        length, consumed = decode_integer(data, 7)
        value = data[consumed : consumed + length]
        if len(value) != length:
            raise HPACKDecodingError("Truncated header block")
        if data[0] & 0x80:
            value = decode_huffman_memoized(value)
        total_consumed += length + consumed
        header: HeaderTuple = NeverIndexedHeaderTuple(name, value) if not_indexable else HeaderTuple(name, value)
        if should_index:
            self.header_table.add(name, value)
        return header, total_consumed


def use_memo_decoder(h2: H2Connection) -> None:
    """Give ``h2`` a :class:`MemoDecoder` with its current decoder's limits; call before it receives a header block
    (the dynamic table starts empty)."""
    current = h2.decoder
    decoder = MemoDecoder(max_header_list_size=current.max_header_list_size)
    decoder.header_table_size = current.header_table_size
    decoder.max_allowed_table_size = current.max_allowed_table_size
    h2.decoder = decoder
