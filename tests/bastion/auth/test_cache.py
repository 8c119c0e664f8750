"""The verified-token cache: one signature check per token, expiry respected, cleared when keys change."""

from __future__ import annotations

import pytest

from bastion._claims import Claims, claims_from_payload
from bastion.auth._cache import VerifiedTokens
from bastion.errors import InvalidToken, TokenExpired
from bastion.testing import FakeClock


class CountingVerifier:
    """Decodes 'sub:exp' strings and counts how often it is asked (a stand-in for the signature check)."""

    def __init__(self) -> None:
        self.verifications = 0
        self.generation = 0

    async def decode(self, token: str) -> Claims:
        self.verifications += 1
        sub, _, exp = token.partition(":")
        if not exp:
            raise InvalidToken()
        return claims_from_payload({"sub": sub, "exp": int(exp)})


async def test_reused_token_is_verified_once() -> None:
    verifier = CountingVerifier()
    tokens = VerifiedTokens(verifier, size=10, leeway=0, clock=FakeClock(100))
    for _ in range(5):
        assert (await tokens.claims("alice:200")).sub == "alice"
    assert verifier.verifications == 1


async def test_cached_token_still_expires() -> None:
    clock = FakeClock(100)
    verifier = CountingVerifier()
    tokens = VerifiedTokens(verifier, size=10, leeway=5, clock=clock)
    await tokens.claims("alice:200")
    clock.now = 205
    await tokens.claims("alice:200")
    clock.now = 206
    with pytest.raises(TokenExpired):
        await tokens.claims("alice:200")
    assert len(tokens) == 0
    assert verifier.verifications == 1


async def test_invalid_tokens_are_not_cached() -> None:
    verifier = CountingVerifier()
    tokens = VerifiedTokens(verifier, size=10, leeway=0, clock=FakeClock(100))
    for _ in range(3):
        with pytest.raises(InvalidToken):
            await tokens.claims("garbage")
    assert verifier.verifications == 3 and len(tokens) == 0


async def test_expired_token_is_not_cached() -> None:
    verifier = CountingVerifier()
    tokens = VerifiedTokens(verifier, size=10, leeway=0, clock=FakeClock(300))
    with pytest.raises(TokenExpired):
        await tokens.claims("alice:200")
    assert len(tokens) == 0


async def test_size_is_bounded_least_recently_used_first() -> None:
    verifier = CountingVerifier()
    tokens = VerifiedTokens(verifier, size=2, leeway=0, clock=FakeClock(100))
    await tokens.claims("a:200")
    await tokens.claims("b:200")
    await tokens.claims("a:200")
    await tokens.claims("c:200")
    assert len(tokens) == 2
    await tokens.claims("a:200")
    assert verifier.verifications == 3
    await tokens.claims("b:200")
    assert verifier.verifications == 4


async def test_key_change_clears_the_cache() -> None:
    verifier = CountingVerifier()
    tokens = VerifiedTokens(verifier, size=10, leeway=0, clock=FakeClock(100))
    await tokens.claims("alice:200")
    verifier.generation += 1
    await tokens.claims("alice:200")
    assert verifier.verifications == 2


async def test_size_zero_disables_caching() -> None:
    verifier = CountingVerifier()
    tokens = VerifiedTokens(verifier, size=0, leeway=0, clock=FakeClock(100))
    await tokens.claims("alice:200")
    await tokens.claims("alice:200")
    assert verifier.verifications == 2
