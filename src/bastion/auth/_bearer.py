"""The bearer credential of a request or call (RFC 6750 2.1) and the ``WWW-Authenticate`` challenges (3)."""

from __future__ import annotations

import re

from bastion.errors import InvalidToken, TokenError

# RFC 6750 2.1: credentials = "Bearer" 1*SP b64token
_BEARER = re.compile(rb"(?i:bearer) +([A-Za-z0-9\-._~+/]+=*) *")
_B64TOKEN_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/"
# RFC 6750 3: error_description is %x20-21 / %x23-5B / %x5D-7E; anything else (a token's non-ASCII alg echoed in
# the message) would make the header unencodable and the 401 a 500.
_NOT_DESCRIPTION = re.compile(r"[^\x20-\x21\x23-\x5b\x5d-\x7e]")


def challenge(realm: str, error: str | None = None, description: str | None = None) -> tuple[str, str]:
    value = f'Bearer realm="{realm}"'
    if error:
        value += f', error="{error}"'
    if description:
        value += f', error_description="{_NOT_DESCRIPTION.sub("?", description)}"'
    return ("www-authenticate", value)


def bearer_token(values: list[bytes], *, max_token_bytes: int, realm: str = "api") -> str:
    """The token of exactly one ``Authorization: Bearer <token>`` value (HTTP header or gRPC metadata).

    Raises TokenError (``UNAUTHORIZED``) when it is missing, repeated or malformed, InvalidToken when it
    is longer than ``max_token_bytes``; each carries its RFC 6750 challenge.
    """
    if len(values) == 1 and len(values[0]) <= max_token_bytes + 16:
        value = values[0]
        if value[:7] == b"Bearer ":  # the usual form, checked without the regex (a third of its cost)
            token = value[7:]
            body = token.rstrip(b"=")
            if body and not body.translate(None, _B64TOKEN_CHARS):
                return token.decode("ascii")
        match = _BEARER.fullmatch(value)
        if match is not None:
            return match.group(1).decode("ascii")
    invalid_request = challenge(realm, "invalid_request", "malformed Authorization header")
    if not values:
        raise TokenError("Missing bearer token", headers=[challenge(realm)])
    if len(values) > 1:
        raise TokenError("Exactly one Authorization header is allowed", headers=[invalid_request])
    if len(values[0]) > max_token_bytes + 16:
        raise InvalidToken("Token too large", headers=[challenge(realm, "invalid_token", "token too large")])
    match = _BEARER.fullmatch(values[0])
    if match is None:
        raise TokenError("Authorization header must be 'Bearer <token>'", headers=[invalid_request])
    return match.group(1).decode("ascii")
