"""Command-argument parsing without a connection or an event loop: paths, ESMTP parameters, the HELO domain."""

from __future__ import annotations

import pytest

from mailrelay.smtp import _replies as r
from mailrelay.smtp._paths import (
    check_mail_parameters,
    parse_parameters,
    parse_path,
    printable_domain,
    strip_keyword,
)
from mailrelay.smtp._replies import Reply

LIMIT = 1000


class TestStripKeyword:
    def test_keyword_is_case_insensitive_and_the_rest_stripped(self) -> None:
        assert strip_keyword("FROM:", "from: <a@example.org> ") == "<a@example.org>"

    def test_missing_keyword(self) -> None:
        assert strip_keyword("FROM:", "TO:<a@example.org>") is None

    def test_no_argument(self) -> None:
        assert strip_keyword("TO:", None) is None


class TestParsePath:
    @pytest.mark.parametrize(
        ("path", "expected"),
        [
            pytest.param("<a@example.org>", ("a@example.org", ""), id="plain"),
            pytest.param("  <a.b+tag@mail.example.org>", ("a.b+tag@mail.example.org", ""), id="leading-blanks"),
            pytest.param(
                "<a@example.org> SIZE=10 BODY=8BITMIME", ("a@example.org", " SIZE=10 BODY=8BITMIME"), id="params"
            ),
            pytest.param("<>", ("<>", ""), id="null-path"),
            pytest.param("<> SIZE=10", ("<>", " SIZE=10"), id="null-path-params"),
            pytest.param("a@example.org", ("a@example.org", ""), id="without-brackets"),
            pytest.param('<"first last"@example.org>', ('"first last"@example.org', ""), id="quoted-local-part"),
            pytest.param("<a@[192.0.2.1]>", ("a@[192.0.2.1]", ""), id="address-literal"),
            pytest.param("<@relay.example:a@example.org>", ("a@example.org", ""), id="source-route"),
            pytest.param("", ("", ""), id="empty"),
            pytest.param("<a@example.org", ("a@example.org", ""), id="unclosed-bracket-tolerated-as-aiosmtpd-does"),
        ],
    )
    def test_valid(self, path: str, expected: tuple[str, str]) -> None:
        assert parse_path(path) == expected

    @pytest.mark.parametrize("path", ['"', "<=@", "<<a@example.org>>", "<a@>", "<a@@example.org>", "@example.org"])
    def test_unparsable_is_no_address(self, path: str) -> None:
        assert parse_path(path) == (None, None)

    @pytest.mark.parametrize(
        "path", ["0\r0", "<a\rb@example.org>", '<"a\x00b"@example.org>', "a\x7f@example.org", "\x1b@x"]
    )
    def test_a_control_character_is_no_address(self, path: str) -> None:
        """Found by the reliability fuzz target: a bare CR or a NUL came back inside the address."""
        assert parse_path(path) == (None, None)


class TestParameters:
    def test_keywords_and_values(self) -> None:
        assert parse_parameters(["SIZE=10", "SMTPUTF8"]) == {"SIZE": "10", "SMTPUTF8": True}

    @pytest.mark.parametrize("words", [["SIZE="], ["=10"], ["X-Y=1"]])
    def test_malformed(self, words: list[str]) -> None:
        assert parse_parameters(words) is None

    @pytest.mark.parametrize(
        "words",
        [[], ["SIZE=1000"], ["BODY=7BIT"], ["BODY=8BITMIME", "SMTPUTF8", "SIZE=0"]],
    )
    def test_accepted_mail_parameters(self, words: list[str]) -> None:
        assert check_mail_parameters(words, max_message_size=LIMIT) is None

    @pytest.mark.parametrize(
        ("words", "reply"),
        [
            pytest.param(["SIZE=1001"], r.SIZE_DECLARED_TOO_LARGE, id="size-over-limit"),
            pytest.param(["SIZE=ten"], r.MAIL_FROM_SYNTAX, id="size-not-a-number"),
            pytest.param(["SIZE"], r.MAIL_FROM_SYNTAX, id="size-without-value"),
            pytest.param(["BODY=BINARYMIME"], r.MAIL_FROM_SYNTAX, id="binarymime"),
            pytest.param(["BODY"], r.MAIL_FROM_SYNTAX, id="body-without-value"),
            pytest.param(["SMTPUTF8=YES"], r.MAIL_FROM_SYNTAX, id="smtputf8-with-value"),
            pytest.param(["SIZE="], r.MAIL_FROM_SYNTAX, id="malformed"),
            pytest.param(["RET=FULL"], r.PARAMETERS_NOT_IMPLEMENTED, id="unknown"),
        ],
    )
    def test_refused_mail_parameters(self, words: list[str], reply: Reply) -> None:
        assert check_mail_parameters(words, max_message_size=LIMIT) == reply


class TestPrintableDomain:
    def test_omitted_domain_is_client(self) -> None:
        assert printable_domain(None) == "client"

    def test_first_word_only(self) -> None:
        assert printable_domain("mx.example.org extra") == "mx.example.org"

    def test_odd_characters_are_replaced(self) -> None:
        assert printable_domain("ex<am>ple\x00") == "ex?am?ple?"

    def test_at_most_255_characters(self) -> None:
        assert printable_domain("a" * 300) == "a" * 255
