"""HPACK for Bastion's gRPC connections: a memo in front of the Huffman decoder, an encoder for the request id.

**Decoding.** gRPC clients (grpcio, nghttp2's h2load, Go's) send ``authorization`` as a literal that is never
indexed, as RFC 7541 7.1.3 advises for credentials, so the server decodes the same ~700-byte bearer token on every
call, in pure Python (about a quarter of a secured unary call's cost; bench/README.md). Each connection decodes
with ``bastion._compat.hpack.MemoDecoder``, which remembers the last few hundred decoded values of 16 bytes or more
(up to 8 KiB each): a repeated token (or a ``:path`` that nghttp2 clients never index) is a dictionary lookup.
Huffman decoding is a pure function of its input, so the memo returns exactly what the decoder would; input it
cannot decode still raises. Only Bastion's own connections use it (``use_memo_decoder``); without the hook on the
installed hpack they keep h2's decoder (``memo_decoder_unavailable`` is logged once).

**Encoding.** Every answer carries a new ``x-request-id``. ``hpack``'s encoder would Huffman-encode each one in
pure Python and add it to the connection's dynamic table, where it is never used again but pushes out the
entries that are (and the encoder searches that table linearly for every header it sends). ``ResponseEncoder``
sends the id as a literal without indexing (RFC 7541 6.2.2), its name and value as they are: the bytes are
a handful longer, the table keeps the headers that repeat, and no Huffman code runs for it.
"""

from __future__ import annotations

import structlog
from h2.connection import H2Connection
from hpack.hpack import INDEX_NONE, Encoder, encode_integer

from bastion._compat import hpack as hpack_compat

log = structlog.get_logger("bastion.grpc")


def memo_decoder_available() -> bool:
    """Whether connections can decode through the memo (checked once, at the gRPC server's start); logs
    ``memo_decoder_unavailable`` naming the hpack version when they cannot."""
    if hpack_compat.supported():
        return True
    log.warning("memo_decoder_unavailable", hpack=hpack_compat.version(), verified=hpack_compat.VERIFIED)
    return False


def use_memo_decoder(h2: H2Connection) -> None:
    """Decode ``h2``'s header blocks through the memo (before its first header block)."""
    hpack_compat.use_memo_decoder(h2)


REQUEST_ID = b"x-request-id"
_REQUEST_ID_LITERAL = INDEX_NONE + bytes(encode_integer(len(REQUEST_ID), 7)) + REQUEST_ID


class ResponseEncoder(Encoder):
    """``hpack.Encoder`` that sends ``x-request-id`` as a literal without indexing (see the module's doc)."""

    def add(self, to_add: tuple[bytes, bytes], sensitive: bool, huffman: bool = False) -> bytes:
        name, value = to_add
        if name == REQUEST_ID:
            return _REQUEST_ID_LITERAL + bytes(encode_integer(len(value), 7)) + value
        return super().add(to_add, sensitive, huffman)
