"""The bearer credential of an Authorization value, and the WWW-Authenticate challenge: what a token's content can put
into the header."""

from __future__ import annotations

import pytest

from bastion.auth._bearer import bearer_token, challenge
from bastion.errors import TokenError


def test_error_description_keeps_only_rfc6750_characters() -> None:
    """A non-ASCII alg echoed in the message once made the header unencodable, turning the 401 into a 500."""
    name, value = challenge("api", "invalid_token", "token alg 'Ā' is not \"RS256\" \\ \r\n")
    assert name == "www-authenticate"
    assert value == 'Bearer realm="api", error="invalid_token", error_description="token alg \'?\' is not ?RS256? ? ??"'
    value.encode("latin-1")


@pytest.mark.parametrize(
    ("value", "token"),
    [
        (b"Bearer abc.DEF-_~+/9", "abc.DEF-_~+/9"),
        (b"Bearer abc==", "abc=="),
        (b"bearer abc", "abc"),  # the scheme is case-insensitive
        (b"Bearer  abc", "abc"),  # 1*SP
        (b"Bearer abc  ", "abc"),
        (b"Bearer a=b", None),  # "=" only as padding
        (b"Bearer ==", None),
        (b"Bearer ", None),
        (b"Bearer ab\xffc", None),
        (b"Bearer ab,c", None),
    ],
)
def test_bearer_value_forms(value: bytes, token: str | None) -> None:
    """The usual ``Bearer <token>`` (checked without the regex) and every other form give the token RFC 6750 2.1's
    grammar gives; what it does not match is a 401 UNAUTHORIZED."""
    if token is None:
        with pytest.raises(TokenError) as raised:
            bearer_token([value], max_token_bytes=100)
        assert raised.value.code == "UNAUTHORIZED"
    else:
        assert bearer_token([value], max_token_bytes=100) == token
