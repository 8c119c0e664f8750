"""RFC 9112's message framing rules that the HTTP/1.1 parser (llhttp) leaves to the server.

llhttp already refuses Content-Length with Transfer-Encoding, differing Content-Lengths, obs-fold and a
Transfer-Encoding whose last coding is not chunked in a header it can read as a list. What it lets through, and
this module decides: the number of ``Host`` headers, a Transfer-Encoding on an HTTP/1.0 request, and a
transfer coding other than chunked before the final chunked (which it would pass on still encoded). Pure
functions over what the parser reported; the protocol answers and closes.
"""

from __future__ import annotations

from bastion.errors import BadRequest, BastionError, TransferCodingNotImplemented

CHUNKED = b"chunked"


def framing_error(http_version: str, host_headers: int, transfer_encoding: bytes | None) -> BastionError | None:
    """The error to answer a request head with, or ``None`` when its framing is sound.

    ``host_headers``: how many ``Host`` header lines the head had. ``transfer_encoding``: its Transfer-Encoding
    field values joined with ``,`` (several lines form one list, RFC 9110 5.3), ``None`` without one.
    """
    if transfer_encoding is not None:
        error = _transfer_coding_error(http_version, transfer_encoding)
        if error is not None:
            return error
    if host_headers > 1:
        return BadRequest("More than one Host header")  # RFC 9112 3.2
    if host_headers == 0 and http_version != "1.0":
        return BadRequest("Missing Host header")  # RFC 9112 3.2: HTTP/1.1 requires it; HTTP/1.0 may omit it
    return None


def _transfer_coding_error(http_version: str, transfer_encoding: bytes) -> BastionError | None:
    if http_version == "1.0":
        # RFC 9112 6.1: an HTTP/1.0 message with Transfer-Encoding is faulty (a 1.0 recipient would frame it by
        # Content-Length or by the close); treat its framing as broken and close.
        return BadRequest("Transfer-Encoding in an HTTP/1.0 request")
    codings = [coding.strip().lower() for coding in transfer_encoding.split(b",")]
    if codings == [CHUNKED]:
        return None
    if codings[-1] != CHUNKED:
        # RFC 9112 6.3 (4): the body length cannot be determined; 400 and close.
        return BadRequest("Transfer-Encoding must end with chunked")
    if CHUNKED in codings[:-1]:
        return BadRequest("chunked applied more than once")  # RFC 9112 6.1: a sender MUST NOT
    # RFC 9112 6.1: a transfer coding the server does not understand (gzip, deflate, compress; identity is no
    # longer a registered coding) SHOULD get 501.
    return TransferCodingNotImplemented()
