"""The official PASETO v4 test vectors (vectors/paseto-v4.json, see vectors/README.md) against our verifier, and
the canonical-base64url rule on fresh tokens."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyseto
import pytest

from bastion.auth._cache import VerifiedTokens
from bastion.auth._paseto import PasetoVerifier, canonical_base64url
from bastion.config import TokenSettings
from bastion.errors import InvalidToken, TokenExpired
from bastion.testing import PasetoMinter

VECTORS = json.loads((Path(__file__).parent / "vectors" / "paseto-v4.json").read_text())["tests"]
BY_NAME = {vector["name"]: vector for vector in VECTORS}
# The vectors' payloads expire at 2022-01-01T00:00:00+00:00: checked just before, and just after.
BEFORE_EXP = datetime(2021, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
AFTER_EXP = datetime(2022, 1, 1, 0, 0, 1, tzinfo=UTC).timestamp()


def vector_verifier(vector: dict[str, Any], tmp_path: Path) -> PasetoVerifier:
    """Our verifier configured with the vector's key: the symmetric key (hex) or the Ed25519 public key (PEM)."""
    if "key" in vector:
        purpose, key = "local", vector["key"]
    else:
        purpose, key = "public", vector["public-key-pem"]
    path = tmp_path / f"{vector['name']}.key"
    path.write_text(key)
    return PasetoVerifier(TokenSettings(format="paseto", purpose=purpose, key_path=str(path)))  # type: ignore[arg-type]


def verified_at(verifier: PasetoVerifier, now: float) -> VerifiedTokens:
    """The whole check a request's token gets (signature, then exp/nbf/iat), at the time ``now``."""
    return VerifiedTokens(verifier, size=4, leeway=0, clock=lambda: now)


def test_the_file_holds_the_seventeen_official_vectors() -> None:
    assert [vector["name"] for vector in VECTORS] == [
        *(f"4-E-{n}" for n in range(1, 10)),
        *(f"4-S-{n}" for n in range(1, 4)),
        *(f"4-F-{n}" for n in range(1, 6)),
    ]


VALID = [vector["name"] for vector in VECTORS if not vector["expect-fail"] and not vector["implicit-assertion"]]
BOUND_TO_AN_ASSERTION = [
    vector["name"] for vector in VECTORS if not vector["expect-fail"] and vector["implicit-assertion"]
]
EXPECT_FAIL = [vector["name"] for vector in VECTORS if vector["expect-fail"]]


@pytest.mark.parametrize("name", VALID)
async def test_a_valid_vector_is_accepted_while_its_claims_allow(name: str, tmp_path: Path) -> None:
    vector = BY_NAME[name]
    verifier = vector_verifier(vector, tmp_path)
    claims = await verified_at(verifier, BEFORE_EXP).claims(vector["token"])
    payload = json.loads(vector["payload"])
    assert claims.extra["data"] == payload["data"]
    assert claims.exp == int(datetime.fromisoformat(payload["exp"]).timestamp())
    with pytest.raises(TokenExpired):
        await verified_at(verifier, AFTER_EXP).claims(vector["token"])


@pytest.mark.parametrize("name", BOUND_TO_AN_ASSERTION)
async def test_a_vector_bound_to_an_implicit_assertion_is_refused(name: str, tmp_path: Path) -> None:
    """Bastion verifies with an empty implicit assertion (it takes none): a token bound to another fails, as the
    PASETO spec requires of a verifier that does not know the assertion."""
    vector = BY_NAME[name]
    with pytest.raises(InvalidToken):
        await verified_at(vector_verifier(vector, tmp_path), BEFORE_EXP).claims(vector["token"])
    key = vector.get("key") or vector["public-key-pem"]
    purpose = "local" if "key" in vector else "public"
    assertion = vector["implicit-assertion"].encode()
    key_object = pyseto.Key.new(4, purpose, bytes.fromhex(key) if purpose == "local" else key)
    assert pyseto.decode(key_object, vector["token"], implicit_assertion=assertion).payload  # the vector is sound


@pytest.mark.parametrize("name", EXPECT_FAIL)
async def test_an_expect_fail_vector_is_refused(name: str, tmp_path: Path) -> None:
    vector = BY_NAME[name]
    verifier = vector_verifier(vector, tmp_path)
    with pytest.raises(InvalidToken):
        await verified_at(verifier, BEFORE_EXP).claims(vector["token"])
    assert verifier.verifications == 0  # refused before any cryptography


def test_4_f_4_differs_from_4_e_1_only_in_unused_bits() -> None:
    """The vector the canonical check exists for: the same bytes as 4-E-1 once decoded."""
    valid, edited = BY_NAME["4-E-1"]["token"], BY_NAME["4-F-4"]["token"]
    assert valid[:-1] == edited[:-1] and valid[-1] != edited[-1]
    assert pyseto.utils.base64url_decode(valid[9:]) == pyseto.utils.base64url_decode(edited[9:])


def flip_unused_bits(segment: str) -> str:
    """``segment`` with its last character's unused bits set: the same bytes, another spelling."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    mask = {2: 0b1111, 3: 0b11}[len(segment) % 4]
    return segment[:-1] + alphabet[alphabet.index(segment[-1]) | mask]


def token_with_footer(minter: PasetoMinter, footer: bytes) -> str:
    """A fresh token of ``minter`` carrying ``footer``, whose lengths leave unused bits in both segments."""
    for padding in range(3):
        payload = json.dumps({"sub": "alice", "exp": "2099-01-01T00:00:00+00:00", "pad": "x" * padding})
        token: str = pyseto.encode(minter._key, payload.encode(), footer=footer).decode()
        body, foot = token.split(".")[2:]
        if len(body) % 4 and len(foot) % 4:
            return token
    raise AssertionError("no padding gave unused bits")


@pytest.mark.parametrize("purpose", ["local", "public"])
@pytest.mark.parametrize("segment", ["payload", "footer"])
async def test_a_fresh_token_with_its_unused_bits_set_is_refused(purpose: str, segment: str, tmp_path: Path) -> None:
    minter = PasetoMinter(purpose)
    path = tmp_path / "paseto.key"
    path.write_bytes(minter.verification_key)
    verifier = PasetoVerifier(TokenSettings(format="paseto", purpose=purpose, key_path=str(path)))  # type: ignore[arg-type]
    token = token_with_footer(minter, b'{"kid":"k12"}')  # 13 bytes: 18 characters, 4 unused bits
    prefix = f"v4.{purpose}."
    body, footer = token[len(prefix) :].split(".")
    assert (await verifier.decode(token)).sub == "alice"
    edited = prefix + (
        f"{flip_unused_bits(body)}.{footer}" if segment == "payload" else f"{body}.{flip_unused_bits(footer)}"
    )
    assert pyseto.decode(minter._key if purpose == "local" else verifier._key, edited).payload  # pyseto alone: accepted
    with pytest.raises(InvalidToken, match="canonical"):
        await verifier.decode(edited)


@pytest.mark.parametrize(
    ("segment", "canonical"),
    [
        pytest.param("AA", True, id="two-chars-unused-bits-zero"),
        pytest.param("AB", False, id="two-chars-unused-bits-set"),
        pytest.param("AAA", True, id="three-chars"),
        pytest.param("AAB", False, id="three-chars-unused-bits-set"),
        pytest.param("AAAA", True, id="four-chars"),
        pytest.param("AAAAA", False, id="impossible-length"),
        pytest.param("AA==", False, id="padding"),
        pytest.param("A+/A", False, id="standard-alphabet"),
        pytest.param("", False, id="empty"),
        pytest.param("AA\n", False, id="newline"),
    ],
)
def test_canonical_base64url(segment: str, canonical: bool) -> None:
    assert canonical_base64url(segment) is canonical


async def test_a_trailing_dot_or_a_third_segment_is_refused(tmp_path: Path) -> None:
    minter = PasetoMinter("local")
    path = tmp_path / "paseto.key"
    path.write_bytes(minter.verification_key)
    verifier = PasetoVerifier(TokenSettings(format="paseto", purpose="local", key_path=str(path)))  # type: ignore[arg-type]
    token = minter.mint()
    for edited in (token + ".", token + ".AAAA.AAAA"):
        with pytest.raises(InvalidToken, match="canonical"):
            await verifier.decode(edited)
