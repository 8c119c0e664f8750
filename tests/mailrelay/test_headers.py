"""Payload v2's header fields: ids, threading, dates and addresses, and their caps on hostile values."""

from __future__ import annotations

from mailrelay._headers import (
    MAX_ADDRESSES,
    MAX_NAME_CHARS,
    MAX_REFERENCES,
    Address,
    addresses,
    message_id,
    message_ids,
    plus_tag,
    rfc3339_date,
)


def test_message_id_loses_its_brackets() -> None:
    assert message_id(" <abc.123@mail.example.org>\t") == "abc.123@mail.example.org"


def test_message_id_of_100_kb_is_left_out() -> None:
    assert message_id("<" + "a" * 100_000 + "@example.org>") is None


def test_message_id_without_brackets_counts() -> None:
    assert message_id("abc@example.org") == "abc@example.org"


def test_garbage_message_id_is_left_out() -> None:
    assert message_id("not an id at all") is None


def test_control_characters_are_removed_from_ids() -> None:
    assert message_id("<a\x00b\x1b@example.org>") == "ab@example.org"


def test_references_keep_order_and_drop_repeats() -> None:
    assert message_ids("<a@x> <b@x>\r\n <a@x> <c@x>") == ["a@x", "b@x", "c@x"]


def test_ten_thousand_references_keep_the_root_and_the_latest() -> None:
    value = " ".join(f"<id{n}@example.org>" for n in range(10_000))
    kept = message_ids(value)
    assert len(kept) == MAX_REFERENCES
    assert kept[0] == "id0@example.org"
    assert kept[1:] == [f"id{n}@example.org" for n in range(10_000 - MAX_REFERENCES + 1, 10_000)]


def test_date_becomes_rfc3339() -> None:
    assert rfc3339_date("Tue, 24 Nov 2026 09:41:07 +0100") == "2026-11-24T09:41:07+01:00"


def test_date_with_unknown_zone_is_utc() -> None:
    assert rfc3339_date("Tue, 24 Nov 2026 09:41:07 -0000") == "2026-11-24T09:41:07+00:00"


def test_bad_date_is_left_out() -> None:
    assert rfc3339_date("yesterday, around noon") is None


def test_addresses_with_names_decoded() -> None:
    raw = '"Doe, John" <john@example.org>, =?utf-8?q?J=C3=BCrgen?= <j@example.de>, plain@example.net'
    assert addresses(raw) == [
        Address(address="john@example.org", name="Doe, John"),
        Address(address="j@example.de", name="Jürgen"),
        Address(address="plain@example.net"),
    ]


def test_encoded_comma_in_a_name_is_not_a_separator() -> None:
    assert addresses("=?utf-8?q?Doe=2C_John?= <john@example.org>") == [
        Address(address="john@example.org", name="Doe, John")
    ]


def test_malformed_addresses_are_skipped() -> None:
    raw = "undisclosed-recipients:;, <>, @, a@@b, <no at sign>, ok@example.org, x y@z, (comment only)"
    assert addresses(raw) == [Address(address="ok@example.org")]


def test_name_decoding_to_control_characters_is_cleaned() -> None:
    (address,) = addresses("=?utf-8?b?QQBCG1sz MW0NCkM=?= <a@example.org>")
    assert address.name is not None
    assert all(c.isprintable() for c in address.name)


def test_long_names_are_cut() -> None:
    (address,) = addresses('"' + "n" * 5000 + '" <a@example.org>')
    assert address.name == "n" * MAX_NAME_CHARS


def test_address_lists_are_capped() -> None:
    raw = ", ".join(f"user{n}@example.org" for n in range(1000))
    assert len(addresses(raw)) == MAX_ADDRESSES


def test_plus_tag() -> None:
    assert plus_tag("inbox+ticket-42@example.test") == "ticket-42"
    assert plus_tag("inbox@example.test") is None
    assert plus_tag("inbox+@example.test") is None
