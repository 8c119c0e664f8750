"""Bearer-token authentication: JWT and PASETO validation, path rules, revocation, claims in the scope."""

from bastion.auth.cache import TokenVerifier, VerifiedTokens
from bastion.auth.claims import Claims, current_claims, optional_claims
from bastion.auth.jwt import JwtVerifier
from bastion.auth.middleware import TokenAuthMiddleware
from bastion.auth.paseto import PasetoVerifier
from bastion.auth.paths import PathRules
from bastion.auth.revocation import Revocations
from bastion.auth.routes import revoke_token_route
from bastion.auth.setup import TokenAuth, verifier_from_settings

__all__ = [
    "Claims",
    "JwtVerifier",
    "PasetoVerifier",
    "PathRules",
    "Revocations",
    "TokenAuth",
    "TokenAuthMiddleware",
    "TokenVerifier",
    "VerifiedTokens",
    "current_claims",
    "optional_claims",
    "revoke_token_route",
    "verifier_from_settings",
]
