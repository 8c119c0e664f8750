"""The listener's RFC 9112 framing rules (``_listener._framing``): pure decisions over what the parser reported."""

from __future__ import annotations

import pytest

from bastion._listener._framing import framing_error
from bastion.errors import BadRequest, TransferCodingNotImplemented


@pytest.mark.parametrize(
    ("version", "hosts", "transfer_encoding"),
    [
        pytest.param("1.1", 1, None, id="http11-with-host"),
        pytest.param("1.1", 1, b"chunked", id="chunked"),
        pytest.param("1.1", 1, b"Chunked ", id="chunked-any-case-and-space"),
        pytest.param("1.0", 0, None, id="http10-without-host"),
        pytest.param("1.0", 1, None, id="http10-with-host"),
    ],
)
def test_sound_framing_is_accepted(version: str, hosts: int, transfer_encoding: bytes | None) -> None:
    assert framing_error(version, hosts, transfer_encoding) is None


@pytest.mark.parametrize(
    ("version", "hosts", "transfer_encoding", "message"),
    [
        pytest.param("1.1", 0, None, "Missing Host header", id="http11-without-host"),
        pytest.param("1.1", 2, None, "More than one Host header", id="two-hosts"),
        pytest.param("1.0", 2, None, "More than one Host header", id="http10-two-hosts"),
        pytest.param("1.0", 0, b"chunked", "Transfer-Encoding in an HTTP/1.0 request", id="http10-chunked"),
        pytest.param("1.1", 1, b"gzip", "Transfer-Encoding must end with chunked", id="gzip-alone"),
        pytest.param("1.1", 1, b"chunked,gzip", "Transfer-Encoding must end with chunked", id="chunked-not-last"),
        pytest.param("1.1", 1, b"chunked,chunked", "chunked applied more than once", id="chunked-twice"),
    ],
)
def test_broken_framing_is_400(version: str, hosts: int, transfer_encoding: bytes | None, message: str) -> None:
    error = framing_error(version, hosts, transfer_encoding)
    assert type(error) is BadRequest
    assert error.detail == message


@pytest.mark.parametrize(
    "transfer_encoding",
    [
        pytest.param(b"gzip, chunked", id="gzip"),
        pytest.param(b"identity, chunked", id="identity"),
        pytest.param(b"x-unknown,chunked", id="unknown"),
        pytest.param(b"gzip,chunked", id="two-header-lines-joined"),
    ],
)
def test_a_coding_before_chunked_is_501(transfer_encoding: bytes) -> None:
    error = framing_error("1.1", 1, transfer_encoding)
    assert isinstance(error, TransferCodingNotImplemented)
    assert error.status == 501


def test_transfer_encoding_is_judged_before_the_host_count() -> None:
    """An HTTP/1.0 request with Transfer-Encoding is faulty whatever else it has."""
    error = framing_error("1.0", 3, b"chunked")
    assert error is not None and error.detail == "Transfer-Encoding in an HTTP/1.0 request"
