"""The verified-token cache: a client reusing one token pays the signature check once, not per request."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from bastion._claims import Claims, check_claims
from bastion._lru import LRU


class TokenVerifier(Protocol):
    """Signature check and claim typing for one token format (JwtVerifier, PasetoVerifier)."""

    verifications: int
    generation: int

    async def decode(self, token: str) -> Claims: ...


class VerifiedTokens:
    """Verify tokens through a bounded LRU keyed by the token string.

    A hit skips the signature check but still runs the time, audience and issuer checks, so an entry
    expires exactly when its token does; expired entries are dropped when met. The cache empties when the
    verifier's keys change (``generation``). Invalid tokens are never cached. Revocation is not cached here:
    the middleware checks it on every request.
    """

    def __init__(
        self,
        verifier: TokenVerifier,
        *,
        size: int,
        leeway: int,
        audience: str | None = None,
        issuer: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.verifier = verifier
        self.size = size
        self.leeway = leeway
        self.audience = audience
        self.issuer = issuer
        self._clock = clock
        self._entries: LRU[str, Claims] = LRU(size)
        self._generation = verifier.generation

    def clear(self) -> None:
        self._entries.clear()

    def forget(self, jti: str) -> int:
        """Drop every cached token with this ``jti`` (a revocation announced by another instance); how many."""
        stale = [token for token, claims in self._entries.items() if claims.jti == jti]
        for token in stale:
            self._entries.pop(token)
        return len(stale)

    def __len__(self) -> int:
        return len(self._entries)

    def cached(self, token: str) -> Claims | None:
        """The claims of ``token`` when its verification is cached (its time, audience and issuer checked again
        now; InvalidToken or TokenExpired, and the entry dropped, when they fail); ``None`` when it is not."""
        if self.verifier.generation != self._generation:
            self._generation = self.verifier.generation
            self._entries.clear()
        cached = self._entries.get(token)
        if cached is not None:
            try:
                check_claims(cached, now=self._clock(), leeway=self.leeway, audience=self.audience, issuer=self.issuer)
            except Exception:
                self._entries.pop(token)
                raise
        return cached

    async def claims(self, token: str) -> Claims:
        """The verified claims of ``token``; raises InvalidToken or TokenExpired."""
        cached = self.cached(token)
        if cached is not None:
            return cached
        now = self._clock()
        claims = await self.verifier.decode(token)
        check_claims(claims, now=now, leeway=self.leeway, audience=self.audience, issuer=self.issuer)
        self._entries.put(token, claims)
        return claims
