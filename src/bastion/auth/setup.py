"""Token authentication assembled from ``[token]`` settings: verifier, cache, path rules, revocation."""

from __future__ import annotations

from bastion.auth.cache import TokenVerifier, VerifiedTokens
from bastion.auth.jwt import JwtVerifier
from bastion.auth.middleware import TokenAuthMiddleware
from bastion.auth.paseto import PasetoVerifier
from bastion.auth.paths import PathRules
from bastion.auth.revocation import Revocations
from bastion.config import TokenSettings
from bastion.types import ASGIApp


def verifier_from_settings(settings: TokenSettings) -> TokenVerifier:
    """A JWT or PASETO verifier; keys are read and checked now (ConfigError at start-up)."""
    if settings.format == "paseto":
        return PasetoVerifier(settings)
    return JwtVerifier(settings)


class TokenAuth:
    """The token-auth capability of one built app: its verifier, cache, rules and the middleware factory."""

    def __init__(self, settings: TokenSettings, *, revocations: Revocations, realm: str) -> None:
        self.settings = settings
        self.verifier = verifier_from_settings(settings)
        self.tokens = VerifiedTokens(
            self.verifier,
            size=settings.verified_cache_size,
            leeway=settings.leeway_seconds,
            audience=settings.required_audience,
            issuer=settings.required_issuer,
        )
        self.rules = PathRules.from_settings(
            include_paths=settings.include_paths,
            exclude_paths=settings.exclude_paths,
            public_paths=settings.public_paths,
        )
        self.revocations = revocations if settings.revocation_enabled else None
        self.realm = realm

    def layer(self, app: ASGIApp) -> ASGIApp:
        return TokenAuthMiddleware(
            app,
            tokens=self.tokens,
            rules=self.rules,
            revocations=self.revocations,
            max_token_bytes=self.settings.max_token_bytes,
            realm=self.realm,
        )
