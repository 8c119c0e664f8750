"""PASETO v4: local and public purposes with real keys, ISO-8601 time claims, key-file checks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bastion._claims import check_claims
from bastion.auth._paseto import PasetoVerifier
from bastion.config import TokenSettings
from bastion.errors import ConfigError, InvalidToken, TokenExpired
from bastion.testing import PasetoMinter


def verifier(minter: PasetoMinter, tmp_path: Path) -> PasetoVerifier:
    path = tmp_path / "paseto.key"
    path.write_bytes(minter.verification_key)
    return PasetoVerifier(TokenSettings(format="paseto", purpose=minter.purpose, key_path=str(path)))  # type: ignore[arg-type]


@pytest.mark.parametrize("purpose", ["local", "public"])
async def test_real_tokens_map_to_claims(tmp_path: Path, purpose: str) -> None:
    minter = PasetoMinter(purpose)
    claims = await verifier(minter, tmp_path).decode(minter.mint(sub="bob", roles=["admin"], client_id="cli"))
    assert (claims.sub, claims.roles, claims.client_id) == ("bob", ("admin",), "cli")
    assert claims.exp > claims.iat  # type: ignore[operator]


@pytest.mark.parametrize("purpose", ["local", "public"])
async def test_expired_iso_exp_is_expired(tmp_path: Path, purpose: str) -> None:
    import time

    minter = PasetoMinter(purpose)
    claims = await verifier(minter, tmp_path).decode(minter.mint(ttl=-100))
    with pytest.raises(TokenExpired):
        check_claims(claims, now=time.time(), leeway=30)


@pytest.mark.parametrize("purpose", ["local", "public"])
async def test_other_key_is_invalid(tmp_path: Path, purpose: str) -> None:
    with pytest.raises(InvalidToken):
        await verifier(PasetoMinter(purpose), tmp_path).decode(PasetoMinter(purpose).mint())


async def test_wrong_purpose_prefix_is_invalid(tmp_path: Path) -> None:
    with pytest.raises(InvalidToken, match=r"not a v4\.public"):
        await verifier(PasetoMinter("public"), tmp_path).decode(PasetoMinter("local").mint())


@pytest.mark.parametrize("exp", ["tomorrow", ["2030"], "2030-01-01T00:00:00"])
async def test_exp_must_be_iso_with_offset(tmp_path: Path, exp: object) -> None:
    minter = PasetoMinter("local")
    with pytest.raises(InvalidToken, match="'exp'"):
        await verifier(minter, tmp_path).decode(minter.mint(exp=exp))


@pytest.mark.parametrize("token", ["v4.local.", "v4.local.!!!!", "v4.local." + "A" * 200, "v4.local.\u00e9\u00e9"])
async def test_garbage_is_invalid(tmp_path: Path, token: str) -> None:
    with pytest.raises(InvalidToken):
        await verifier(PasetoMinter("local"), tmp_path).decode(token)


class TestKeyFile:
    def test_missing_key_path(self) -> None:
        with pytest.raises(ValueError, match=r"token\.format = 'paseto' needs token\.key_path"):
            TokenSettings(format="paseto", purpose="local")

    def test_short_local_key(self, tmp_path: Path) -> None:
        path = tmp_path / "k"
        path.write_bytes(os.urandom(16).hex().encode())
        with pytest.raises(ConfigError, match="32 bytes"):
            PasetoVerifier(TokenSettings(format="paseto", purpose="local", key_path=str(path)))

    def test_private_key_for_public_purpose_is_refused(self, tmp_path: Path) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        path = tmp_path / "k.pem"
        path.write_bytes(
            Ed25519PrivateKey.generate().private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        with pytest.raises(ConfigError, match="private key"):
            PasetoVerifier(TokenSettings(format="paseto", purpose="public", key_path=str(path)))

    def test_paserk_local_key(self, tmp_path: Path) -> None:
        import pyseto

        raw = os.urandom(32)
        path = tmp_path / "k"
        path.write_text(pyseto.Key.new(4, "local", raw).to_paserk())
        PasetoVerifier(TokenSettings(format="paseto", purpose="local", key_path=str(path)))
