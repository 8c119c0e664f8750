"""Claims: type checks on every registered claim, time checks with leeway, audience and issuer."""

from __future__ import annotations

import pytest

from bastion._claims import check_claims, claims_from_payload
from bastion.errors import InvalidToken, TokenExpired

NOW = 1_800_000_000


def claims(**payload: object) -> object:
    return claims_from_payload({"exp": NOW + 60, **payload})


class TestTypes:
    def test_all_fields_and_extras(self) -> None:
        parsed = claims_from_payload(
            {
                "sub": "alice",
                "exp": NOW,
                "iat": NOW - 10,
                "jti": "j1",
                "roles": ["user", "admin"],
                "perms": ["documents:read"],
                "username": "Alice",
                "email": "alice@example.com",
                "client_id": "web",
                "tenant": 7,
                "aud": "docs",
            }
        )
        assert parsed.sub == "alice" and parsed.roles == ("user", "admin") and parsed.perms == ("documents:read",)
        assert parsed.client_id == "web" and parsed.username == "Alice" and parsed.email == "alice@example.com"
        assert dict(parsed.extra) == {"tenant": 7, "aud": "docs"}
        assert parsed.has_role("admin")

    @pytest.mark.parametrize(
        "payload",
        [
            pytest.param({"exp": "tomorrow"}, id="exp-string"),
            pytest.param({"exp": True}, id="exp-bool"),
            pytest.param({"exp": float("nan")}, id="exp-nan"),
            pytest.param({"exp": NOW, "roles": "admin"}, id="roles-string"),
            pytest.param({"exp": NOW, "roles": [1, 2]}, id="roles-numbers"),
            pytest.param({"exp": NOW, "sub": 42}, id="sub-number"),
            pytest.param({"exp": NOW, "jti": ["a"]}, id="jti-list"),
            pytest.param({"exp": NOW, "iat": "yesterday"}, id="iat-string"),
            pytest.param({"sub": "alice"}, id="no-exp"),
        ],
    )
    def test_wrong_types_are_invalid(self, payload: dict[str, object]) -> None:
        with pytest.raises(InvalidToken):
            claims_from_payload(payload)

    @pytest.mark.parametrize("payload", [[], "text", 3, None])
    def test_payload_must_be_an_object(self, payload: object) -> None:
        with pytest.raises(InvalidToken, match="JSON object"):
            claims_from_payload(payload)

    def test_absent_roles_are_empty_not_an_error(self) -> None:
        assert claims().roles == ()  # type: ignore[attr-defined]


class TestTimes:
    def test_exp_exactly_at_leeway_boundary_passes(self) -> None:
        check_claims(claims_from_payload({"exp": NOW - 30}), now=NOW, leeway=30)

    def test_one_second_past_the_leeway_is_expired(self) -> None:
        with pytest.raises(TokenExpired):
            check_claims(claims_from_payload({"exp": NOW - 31}), now=NOW, leeway=30)

    def test_zero_leeway(self) -> None:
        check_claims(claims_from_payload({"exp": NOW}), now=NOW, leeway=0)
        with pytest.raises(TokenExpired):
            check_claims(claims_from_payload({"exp": NOW}), now=NOW + 0.5, leeway=0)

    def test_nbf_in_the_future_beyond_leeway_is_invalid(self) -> None:
        with pytest.raises(InvalidToken, match="not valid yet"):
            check_claims(claims_from_payload({"exp": NOW + 600, "nbf": NOW + 31}), now=NOW, leeway=30)

    def test_nbf_within_leeway_passes(self) -> None:
        check_claims(claims_from_payload({"exp": NOW + 600, "nbf": NOW + 30}), now=NOW, leeway=30)


class TestAudienceAndIssuer:
    def test_audience_string_and_list(self) -> None:
        check_claims(claims_from_payload({"exp": NOW, "aud": "docs"}), now=NOW, leeway=0, audience="docs")
        check_claims(claims_from_payload({"exp": NOW, "aud": ["x", "docs"]}), now=NOW, leeway=0, audience="docs")

    @pytest.mark.parametrize("aud", [None, "other", ["other"]])
    def test_wrong_or_missing_audience(self, aud: object) -> None:
        payload = {"exp": NOW} if aud is None else {"exp": NOW, "aud": aud}
        with pytest.raises(InvalidToken, match="audience"):
            check_claims(claims_from_payload(payload), now=NOW, leeway=0, audience="docs")

    def test_issuer(self) -> None:
        check_claims(claims_from_payload({"exp": NOW, "iss": "idp"}), now=NOW, leeway=0, issuer="idp")
        with pytest.raises(InvalidToken, match="issuer"):
            check_claims(claims_from_payload({"exp": NOW, "iss": "evil"}), now=NOW, leeway=0, issuer="idp")

    def test_unset_requirements_are_not_checked(self) -> None:
        check_claims(claims_from_payload({"exp": NOW, "aud": "anything", "iss": "anyone"}), now=NOW, leeway=0)
