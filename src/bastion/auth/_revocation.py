"""Token revocation in the cache store: ``jwt:revoked:{jti}`` = reason, expiring when the token does."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import datetime

from bastion._cache_store import CacheStore
from bastion._claims import Claims
from bastion.errors import InvalidToken, TokenRevoked

KEY_PREFIX = "jwt:revoked:"
MAX_JTI_CHARS = 256


def revocation_key(jti: str) -> str:
    return KEY_PREFIX + jti


class Revocations:
    """Check and record revoked tokens. A store outage raises CacheStoreError (500), never a pass."""

    def __init__(self, store: CacheStore, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self._clock = clock

    async def check(self, claims: Claims) -> None:
        """Raise TokenRevoked for a revoked ``jti``; InvalidToken when the token has none (fail closed)."""
        if await self.store.exists(self.key_for(claims)):
            raise TokenRevoked()

    @staticmethod
    def key_for(claims: Claims) -> str:
        """The key to test for ``claims``; InvalidToken when the token has no ``jti`` (fail closed)."""
        if not claims.jti:
            raise InvalidToken("token has no jti, which revocation requires")
        return revocation_key(claims.jti)

    async def revoke(self, jti: str, reason: str, expires_at: float | datetime) -> None:
        """Revoke ``jti`` until ``expires_at`` (the token's ``exp``, Unix seconds or an aware datetime).

        A token that has already expired needs no entry and gets none.
        """
        if not jti or len(jti) > MAX_JTI_CHARS:
            raise ValueError(f"jti must be 1-{MAX_JTI_CHARS} characters")
        until = expires_at.timestamp() if isinstance(expires_at, datetime) else float(expires_at)
        ttl = until - self._clock()
        if not math.isfinite(ttl) or ttl <= 0:
            return
        await self.store.set(revocation_key(jti), reason.encode("utf-8"), ttl_secs=ttl)

    async def is_revoked(self, jti: str) -> bool:
        return await self.store.exists(revocation_key(jti))
