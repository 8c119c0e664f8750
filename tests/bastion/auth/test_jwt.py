"""JWT verification: every algorithm with real keys, the classic attacks, key checks, JWKS file and URL."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from bastion.auth._jwt import JwtVerifier
from bastion.config import TokenSettings
from bastion.errors import ConfigError, InvalidToken, Unavailable
from bastion.testing import FakeClock, TokenMinter

ALGORITHMS = ["RS256", "RS384", "RS512", "ES256", "ES384", "HS256", "HS384", "HS512"]


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def minters() -> dict[str, TokenMinter]:
    return {alg: TokenMinter(alg) for alg in ALGORITHMS}


def verifier_for(minter: TokenMinter, tmp_path: Path, **settings: Any) -> JwtVerifier:
    if minter.algorithm.startswith("HS"):
        return JwtVerifier(TokenSettings(algorithm=minter.algorithm, secret=minter.secret, **settings))
    path = tmp_path / "public.pem"
    path.write_bytes(minter.public_pem())
    return JwtVerifier(TokenSettings(algorithm=minter.algorithm, public_key_path=str(path), **settings))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_every_algorithm_verifies_real_tokens(
    minters: dict[str, TokenMinter], tmp_path: Path, algorithm: str
) -> None:
    minter = minters[algorithm]
    claims = await verifier_for(minter, tmp_path).decode(minter.mint(sub="alice", roles=["user"], email="a@x.io"))
    assert (claims.sub, claims.roles, claims.email) == ("alice", ("user",), "a@x.io")


@pytest.mark.parametrize("algorithm", ["RS256", "ES256", "HS256"])
async def test_token_signed_by_another_key_is_invalid(tmp_path: Path, algorithm: str) -> None:
    verifier = verifier_for(TokenMinter(algorithm), tmp_path)
    with pytest.raises(InvalidToken):
        await verifier.decode(TokenMinter(algorithm).mint())


async def test_other_configured_algorithm_is_refused(minters: dict[str, TokenMinter], tmp_path: Path) -> None:
    """An RS384 token is refused by an RS256 service even with the same key."""
    rs256 = minters["RS256"]
    rs384 = TokenMinter("RS384", key=rs256.key)
    with pytest.raises(InvalidToken, match="alg 'RS384' is not the configured RS256"):
        await verifier_for(rs256, tmp_path).decode(rs384.mint())


class TestAttacks:
    async def test_alg_none_is_refused(self, minters: dict[str, TokenMinter], tmp_path: Path) -> None:
        token = b64(b'{"alg":"none","typ":"JWT"}') + "." + b64(b'{"sub":"admin","exp":9999999999}') + "."
        with pytest.raises(InvalidToken, match="'none'"):
            await verifier_for(minters["RS256"], tmp_path).decode(token)

    async def test_hs256_signed_with_the_rsa_public_key_is_refused(
        self, minters: dict[str, TokenMinter], tmp_path: Path
    ) -> None:
        """The algorithm-confusion attack: the public PEM used as an HMAC secret."""
        public_pem = minters["RS256"].public_pem()
        signing_input = b64(b'{"alg":"HS256","typ":"JWT"}') + "." + b64(b'{"sub":"admin","exp":9999999999}')
        signature = hmac.new(public_pem, signing_input.encode(), hashlib.sha256).digest()
        with pytest.raises(InvalidToken):
            await verifier_for(minters["RS256"], tmp_path).decode(signing_input + "." + b64(signature))

    async def test_tampered_payload_is_refused(self, minters: dict[str, TokenMinter], tmp_path: Path) -> None:
        header, _, signature = minters["ES256"].mint(sub="alice").split(".")
        forged = b64(json.dumps({"sub": "admin", "exp": 9999999999}).encode())
        with pytest.raises(InvalidToken):
            await verifier_for(minters["ES256"], tmp_path).decode(f"{header}.{forged}.{signature}")

    @pytest.mark.parametrize(
        "token",
        [
            pytest.param("garbage", id="one-part"),
            pytest.param("a.b.c", id="bad-base64-header"),
            pytest.param(b64(b'{"alg":"RS256"}') + ".!!!.###", id="bad-base64-body"),
            pytest.param(b64(b'{"alg":"RS256"}') + "." + b64(b"not json") + "." + b64(b"sig"), id="non-json-payload"),
            pytest.param(b64(b"[1,2]") + ".e30.", id="header-not-object"),
            pytest.param(b64('{"alg":"RS256","kid":"\u00e9"}'.encode()) + ".e30.x", id="unicode"),
            pytest.param(b64(b'{"alg":"RS256"}') + "." + b64(b"{}") * 5000 + ".x", id="huge"),
        ],
    )
    async def test_garbage_is_invalid_never_a_crash(
        self, minters: dict[str, TokenMinter], tmp_path: Path, token: str
    ) -> None:
        with pytest.raises(InvalidToken):
            await verifier_for(minters["RS256"], tmp_path).decode(token)

    async def test_wrong_claim_types_in_a_signed_token(self, minters: dict[str, TokenMinter], tmp_path: Path) -> None:
        verifier = verifier_for(minters["RS256"], tmp_path)
        for claims in ({"exp": "tomorrow"}, {"roles": "admin"}):
            with pytest.raises(InvalidToken):
                await verifier.decode(minters["RS256"].mint(**claims))

    async def test_counts_signature_checks(self, minters: dict[str, TokenMinter], tmp_path: Path) -> None:
        verifier = verifier_for(minters["RS256"], tmp_path)
        token = minters["RS256"].mint()
        await verifier.decode(token)
        await verifier.decode(token)
        assert verifier.verifications == 2


class TestKeys:
    def test_rsa_key_under_2048_bits_is_refused(self, tmp_path: Path) -> None:
        small = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key()
        path = tmp_path / "small.pem"
        path.write_bytes(
            small.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        with pytest.raises(ConfigError, match="1024 bits; at least 2048"):
            JwtVerifier(TokenSettings(algorithm="RS256", public_key_path=str(path)))

    def test_ec_curve_must_match(self, tmp_path: Path) -> None:
        key = ec.generate_private_key(ec.SECP384R1()).public_key()
        path = tmp_path / "p384.pem"
        path.write_bytes(key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        with pytest.raises(ConfigError, match="ES256 needs curve P-256"):
            JwtVerifier(TokenSettings(algorithm="ES256", public_key_path=str(path)))

    def test_private_key_is_refused(self, minters: dict[str, TokenMinter], tmp_path: Path) -> None:
        path = tmp_path / "private.pem"
        path.write_bytes(minters["RS256"].private_pem())
        with pytest.raises(ConfigError, match="private key"):
            JwtVerifier(TokenSettings(algorithm="RS256", public_key_path=str(path)))

    def test_short_hmac_secret_is_refused(self) -> None:
        with pytest.raises(ConfigError, match=r"token\.secret is 6 bytes; HS256 needs at least 32"):
            JwtVerifier(TokenSettings(algorithm="HS256", secret="secret"))

    def test_secret_for_rsa_is_refused(self) -> None:
        with pytest.raises(ValueError, match=r"token\.secret is for HS256/HS384/HS512; token\.algorithm = 'RS256'"):
            TokenSettings(algorithm="RS256", secret="x" * 64)

    def test_public_key_for_hmac_is_refused(self) -> None:
        with pytest.raises(ValueError, match=r"token\.public_key_path is for RS\*/ES\* keys; .* needs token\.secret"):
            TokenSettings(algorithm="HS256", public_key_path="/k.pem")

    def test_missing_key_file_names_the_key_and_path(self, tmp_path: Path) -> None:
        absent = tmp_path / "absent.pem"
        with pytest.raises(ConfigError) as info:
            JwtVerifier(TokenSettings(algorithm="RS256", public_key_path=str(absent)))
        assert str(info.value) == f"token.public_key_path = {str(absent)!r}: cannot read the file (no such file)"

    def test_garbage_key_file(self, tmp_path: Path) -> None:
        path = tmp_path / "junk.pem"
        path.write_text("-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n")
        with pytest.raises(ConfigError, match="not a PEM public key"):
            JwtVerifier(TokenSettings(algorithm="RS256", public_key_path=str(path)))

    def test_two_key_sources_are_refused(self) -> None:
        with pytest.raises(ValueError, match=r"token\.secret and token\.jwks_path are both set"):
            TokenSettings(algorithm="HS256", secret="x" * 64, jwks_path="/x")

    def test_enabled_without_a_key_is_refused(self) -> None:
        with pytest.raises(ValueError, match=r"token\.enabled is true but no key is set"):
            TokenSettings(enabled=True)

    def test_secret_never_appears_in_errors(self) -> None:
        with pytest.raises(ConfigError) as info:
            JwtVerifier(TokenSettings(algorithm="HS512", secret="tiny-but-secret"))
        assert "tiny-but-secret" not in str(info.value)


class TestJwksFile:
    @pytest.fixture
    def two_keys(self, tmp_path: Path) -> tuple[TokenMinter, TokenMinter, Path]:
        first, second = TokenMinter("RS256", kid="k1"), TokenMinter("RS256", kid="k2")
        path = tmp_path / "jwks.json"
        path.write_text(json.dumps({"keys": first.jwks()["keys"] + second.jwks()["keys"]}))
        return first, second, path

    async def test_token_is_checked_with_the_key_its_kid_names(
        self, two_keys: tuple[TokenMinter, TokenMinter, Path]
    ) -> None:
        first, second, path = two_keys
        verifier = JwtVerifier(TokenSettings(algorithm="RS256", jwks_path=str(path)))
        assert (await verifier.decode(first.mint(sub="a"))).sub == "a"
        assert (await verifier.decode(second.mint(sub="b"))).sub == "b"

    async def test_unknown_kid_is_refused(self, two_keys: tuple[TokenMinter, TokenMinter, Path]) -> None:
        first, _, path = two_keys
        verifier = JwtVerifier(TokenSettings(algorithm="RS256", jwks_path=str(path)))
        stranger = TokenMinter("RS256", key=first.key, kid="k9")
        with pytest.raises(InvalidToken, match="kid is not a known key"):
            await verifier.decode(stranger.mint())

    async def test_missing_kid_with_several_keys_is_refused(
        self, two_keys: tuple[TokenMinter, TokenMinter, Path]
    ) -> None:
        first, _, path = two_keys
        verifier = JwtVerifier(TokenSettings(algorithm="RS256", jwks_path=str(path)))
        with pytest.raises(InvalidToken, match="no kid"):
            await verifier.decode(TokenMinter("RS256", key=first.key).mint())

    def test_jwks_without_a_usable_key_is_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "jwks.json"
        path.write_text(json.dumps(TokenMinter("ES256", kid="e").jwks()))
        with pytest.raises(ConfigError, match="no key in the JWKS can verify RS256"):
            JwtVerifier(TokenSettings(algorithm="RS256", jwks_path=str(path)))

    def test_not_a_jwks(self, tmp_path: Path) -> None:
        path = tmp_path / "jwks.json"
        path.write_text("{not json")
        with pytest.raises(ConfigError, match="not a JWKS document"):
            JwtVerifier(TokenSettings(algorithm="RS256", jwks_path=str(path)))


class JwksServer:
    """A real HTTP server on loopback that serves a JWKS document and counts fetches."""

    def __init__(self) -> None:
        self.document: dict[str, Any] = {"keys": []}
        self.fetches = 0
        self.status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.fetches += 1
                body = json.dumps(outer.document).encode()
                self.send_response(outer.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/.well-known/jwks.json"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def jwks_server() -> Iterator[JwksServer]:
    server = JwksServer()
    yield server
    server.close()


class TestJwksUrl:
    def make(self, server: JwksServer, clock: Callable[[], float]) -> JwtVerifier:
        from bastion.auth._jwks import JwksUrlSource

        source = JwksUrlSource(server.url, refresh_secs=300, clock=clock)
        return JwtVerifier(TokenSettings(algorithm="RS256", jwks_url=server.url), jwks_source=source)

    async def test_fetched_once_and_cached(self, jwks_server: JwksServer) -> None:
        minter = TokenMinter("RS256", kid="k1")
        jwks_server.document = minter.jwks()
        verifier = self.make(jwks_server, FakeClock(1000.0))
        for _ in range(3):
            assert (await verifier.decode(minter.mint(sub="x"))).sub == "x"
        assert jwks_server.fetches == 1

    async def test_unknown_kid_triggers_a_refresh(self, jwks_server: JwksServer) -> None:
        old, new = TokenMinter("RS256", kid="old"), TokenMinter("RS256", kid="new")
        jwks_server.document = old.jwks()
        clock = FakeClock(1000.0)
        verifier = self.make(jwks_server, clock)
        await verifier.decode(old.mint())
        jwks_server.document = {"keys": old.jwks()["keys"] + new.jwks()["keys"]}
        clock.now += 11
        assert (await verifier.decode(new.mint(sub="rotated"))).sub == "rotated"
        assert jwks_server.fetches == 2
        assert verifier.generation == 2

    async def test_unknown_kids_cannot_hammer_the_identity_provider(self, jwks_server: JwksServer) -> None:
        minter = TokenMinter("RS256", kid="k1")
        jwks_server.document = minter.jwks()
        verifier = self.make(jwks_server, FakeClock(1000.0))
        await verifier.decode(minter.mint())
        for n in range(20):
            with pytest.raises(InvalidToken):
                await verifier.decode(TokenMinter("RS256", key=minter.key, kid=f"random-{n}").mint())
        assert jwks_server.fetches == 1

    async def test_unreachable_jwks_is_503_not_a_pass(self, jwks_server: JwksServer) -> None:
        jwks_server.status = 500
        verifier = self.make(jwks_server, FakeClock(1000.0))
        with pytest.raises(Unavailable):
            await verifier.decode(TokenMinter("RS256", kid="k1").mint())

    async def test_failed_refresh_keeps_the_old_keys(self, jwks_server: JwksServer) -> None:
        minter = TokenMinter("RS256", kid="k1")
        jwks_server.document = minter.jwks()
        clock = FakeClock(1000.0)
        verifier = self.make(jwks_server, clock)
        await verifier.decode(minter.mint())
        jwks_server.status = 503
        clock.now += 301
        assert (await verifier.decode(minter.mint(sub="still"))).sub == "still"
        assert jwks_server.fetches == 2
