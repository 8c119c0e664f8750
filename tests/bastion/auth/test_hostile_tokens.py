"""Tokens a client crafts to break the server: absurd time claims are a 401, never a 500; an ES256 signature's
other form (s -> n - s) verifies, and the token's identity for revocation is its jti, not its spelling."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import httpx
import pytest
from fastapi import Depends
from joserfc import jws

from bastion import Service, Settings, load_settings
from bastion.auth import Claims, current_claims
from bastion.testing import PasetoMinter, TokenMinter

Client = Callable[..., httpx.AsyncClient]
# The order of the P-256 group (FIPS 186-4 D.1.2.3): an ECDSA signature (r, s) also verifies as (r, n - s).
P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def service() -> Service:
    svc = Service("hostile-tokens")

    @svc.version(1).get("/me")
    async def me(claims: Annotated[Claims, Depends(current_claims)]) -> dict[str, object]:
        return {"sub": claims.sub}

    return svc


@pytest.fixture(scope="module")
def minter() -> TokenMinter:
    return TokenMinter("ES256")


@pytest.fixture
def settings(minter: TokenMinter, tmp_path: Path) -> Settings:
    path = tmp_path / "public.pem"
    path.write_bytes(minter.public_pem())
    return load_settings(
        environ={
            "SERVICE_TOKEN_ALGORITHM": "ES256",
            "SERVICE_TOKEN_PUBLIC_KEY_PATH": str(path),
            "SERVICE_TOKEN_LEEWAY_SECONDS": "0",
            "SERVICE_TOKEN_REVOCATION_ENABLED": "true",
            "SERVICE_RATE_LIMIT_ENABLED": "false",
        }
    )


def signed(minter: TokenMinter, payload: str) -> str:
    """A JWT whose payload is exactly the JSON text ``payload`` (numbers no JSON encoder would write)."""
    return str(jws.serialize_compact({"alg": "ES256"}, payload.encode(), minter.key, algorithms=["ES256"]))


NOW = int(time.time())
ABSURD = [
    pytest.param("18446744073709551616", id="2^64"),
    pytest.param("1" + "0" * 400, id="integer-of-401-digits"),
    pytest.param("1e400", id="1e400-overflows-to-infinity"),
    pytest.param("Infinity", id="Infinity"),
    pytest.param("NaN", id="NaN"),
    pytest.param("1.7976931348623157e308", id="largest-float"),
    pytest.param("-1", id="negative"),
    pytest.param(f"{NOW + 3600}.5", id="fraction"),
    pytest.param("true", id="bool"),
    pytest.param('"2030-01-01"', id="string"),
    pytest.param("[]", id="array"),
]


@pytest.mark.parametrize("claim", ["exp", "nbf", "iat"])
@pytest.mark.parametrize("value", ABSURD)
async def test_an_absurd_time_claim_is_401_invalid_token(
    asgi_client: Client, minter: TokenMinter, settings: Settings, claim: str, value: str
) -> None:
    exp = "" if claim == "exp" else f'"exp": {NOW + 3600}, '
    token = signed(minter, f'{{"sub": "alice", "jti": "j1", {exp}"{claim}": {value}}}')
    response = await asgi_client(service(), settings).get("/api/v1/me", headers={"authorization": f"Bearer {token}"})
    assert response.status_code == 401
    assert response.json()["code"] == "INVALID_TOKEN"


async def test_whole_seconds_written_as_a_float_are_a_numeric_date(
    asgi_client: Client, minter: TokenMinter, settings: Settings
) -> None:
    token = signed(minter, f'{{"sub": "alice", "jti": "j1", "exp": {NOW + 3600}.0, "iat": {NOW}e0}}')
    response = await asgi_client(service(), settings).get("/api/v1/me", headers={"authorization": f"Bearer {token}"})
    assert response.json() == {"sub": "alice"}


@pytest.mark.parametrize("exp", ["10000-01-01T00:00:00+00:00", "1969-12-31T23:59:59+00:00", "+1e400"])
async def test_an_absurd_paseto_exp_is_401(asgi_client: Client, tmp_path: Path, exp: str) -> None:
    minter = PasetoMinter("public")
    path = tmp_path / "paseto.pub"
    path.write_bytes(minter.verification_key)
    settings = load_settings(
        environ={
            "SERVICE_TOKEN_FORMAT": "paseto",
            "SERVICE_TOKEN_PURPOSE": "public",
            "SERVICE_TOKEN_KEY_PATH": str(path),
            "SERVICE_RATE_LIMIT_ENABLED": "false",
        }
    )
    token = minter.mint(exp=exp)
    response = await asgi_client(service(), settings).get("/api/v1/me", headers={"authorization": f"Bearer {token}"})
    assert response.status_code == 401
    assert response.json()["code"] == "INVALID_TOKEN"


def high_s(token: str) -> str:
    """``token`` with its ES256 signature's other form: the same r, s replaced by n - s."""
    head, payload, signature = token.split(".")
    raw = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
    r, s = raw[:32], int.from_bytes(raw[32:], "big")
    other = r + (P256_ORDER - s).to_bytes(32, "big")
    return f"{head}.{payload}.{base64.urlsafe_b64encode(other).rstrip(b'=').decode()}"


async def test_an_es256_signature_in_its_other_form_verifies_and_is_revoked_with_its_jti(
    asgi_client: Client, minter: TokenMinter, settings: Settings
) -> None:
    """ECDSA signatures are malleable; issuers sign with either form (OpenSSL, Go, Java do not normalize s), so
    both verify, as RFC 7518 3.4 and joserfc have it. What identifies a token is its jti: revoking it refuses
    both spellings."""
    client = asgi_client(service(), settings)
    token = minter.mint(sub="alice", jti="j-malleable")
    other = high_s(token)
    assert other != token
    for spelling in (token, other):
        response = await client.get("/api/v1/me", headers={"authorization": f"Bearer {spelling}"})
        assert response.json() == {"sub": "alice"}
    await client._transport.app.revoke("j-malleable", "test", NOW + 3600)  # type: ignore[attr-defined]
    for spelling in (token, other):
        response = await client.get("/api/v1/me", headers={"authorization": f"Bearer {spelling}"})
        assert (response.status_code, response.json()["code"]) == (401, "TOKEN_REVOKED")


def test_the_payload_written_is_the_one_signed(minter: TokenMinter) -> None:
    payload = '{"exp": 1e400}'
    token = signed(minter, payload)
    segment = token.split(".")[1]
    assert json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))) == {"exp": float("inf")}
