"""Token formats are verifiers in a registry: one entry per ``token.format`` value.

Each entry carries what the rest of Bastion asks of a format: its verifier (built from ``[token]``, keys read and
checked now), the bearer format the API documents name (``bearerFormat``), its label in the security posture and
the test minter ``bastion.testing`` builds for it. A new format is one verifier module plus one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bastion.auth._cache import TokenVerifier
from bastion.auth._jwt import JwtVerifier
from bastion.auth._paseto import PasetoVerifier
from bastion.config import TokenSettings
from bastion.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenFormat:
    """One ``token.format``: how its tokens are verified, documented, described and minted in tests."""

    name: str
    bearer_format: str
    """The OpenAPI ``bearerFormat`` of the security scheme (``JWT``, ``PASETO``)."""
    verifier: Callable[[TokenSettings], TokenVerifier]
    label: Callable[[TokenSettings], tuple[str, str]]
    """``(posture field, value)`` naming the algorithm: ``("algorithm", "RS256")``, ``("paseto", "v4.public")``."""
    describe: Callable[[TokenSettings], str]
    """How ``bastion check-config`` names the algorithm (``RS256``, ``PASETO v4.public``)."""
    wrong_minter: Callable[[TokenSettings], str]
    """What a test client says when given a minter whose tokens these settings refuse."""
    minter: str
    """``module:function`` of ``bastion.testing``'s minter factory, ``factory(TokenSettings) -> minter`` (a name,
    not an import: the test helpers sit above the capabilities)."""


FORMATS: dict[str, TokenFormat] = {
    entry.name: entry
    for entry in (
        TokenFormat(
            name="jwt",
            bearer_format="JWT",
            verifier=JwtVerifier,
            label=lambda token: ("algorithm", token.algorithm),
            describe=lambda token: token.algorithm,
            wrong_minter=lambda token: (
                f"token.algorithm = {token.algorithm!r} needs a TokenMinter for {token.algorithm}"
            ),
            minter="bastion.testing._tokens:jwt_minter",
        ),
        TokenFormat(
            name="paseto",
            bearer_format="PASETO",
            verifier=PasetoVerifier,
            label=lambda token: ("paseto", f"{token.version}.{token.purpose}"),
            describe=lambda token: f"PASETO {token.version}.{token.purpose}",
            wrong_minter=lambda token: (
                f"token.format = 'paseto' with purpose {token.purpose!r} needs a PasetoMinter of it"
            ),
            minter="bastion.testing._tokens:paseto_minter",
        ),
    )
}


def token_format(name: str) -> TokenFormat:
    """The registry entry of ``token.format = name`` (ConfigError for a name nothing registered)."""
    entry = FORMATS.get(name)
    if entry is None:
        raise ConfigError(f"token.format = {name!r} is not one of {', '.join(sorted(FORMATS))}")
    return entry
