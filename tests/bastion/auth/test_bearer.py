"""The WWW-Authenticate challenge: what a token's content can put into the header."""

from __future__ import annotations

from bastion.auth._bearer import challenge


def test_error_description_keeps_only_rfc6750_characters() -> None:
    """A non-ASCII alg echoed in the message once made the header unencodable, turning the 401 into a 500."""
    name, value = challenge("api", "invalid_token", "token alg 'Ā' is not \"RS256\" \\ \r\n")
    assert name == "www-authenticate"
    assert value == 'Bearer realm="api", error="invalid_token", error_description="token alg \'?\' is not ?RS256? ? ??"'
    value.encode("latin-1")
