"""The attachment policy: every rule with both actions, hostile file names, lying content types."""

from __future__ import annotations

import struct

import pytest

from mailrelay._attachment_policy import (
    ELF_TYPE,
    MACHO_TYPE,
    PE_TYPE,
    AttachmentPolicy,
    Dropped,
    PolicyAction,
    PolicyRule,
    extensions,
    normalize_type,
    sniff_executable,
    type_matches,
)
from mailrelay._errors import AttachmentRejected, AttachmentTooLarge
from mailrelay._parsing import MimePart, parse_message

PE = b"MZ" + b"\x00" * 58 + struct.pack("<I", 64) + b"PE\x00\x00" + b"\x00" * 32


def part(name: str | None = "a.txt", content_type: str = "text/plain", data: bytes = b"x") -> MimePart:
    return MimePart(content_type=content_type, data=data, filename=name)


def policy(**rules: object) -> AttachmentPolicy:
    return AttachmentPolicy(**{"max_bytes": 1000, **rules})  # type: ignore[arg-type]


# one attachment breaking each rule, with the rules that catch it
CASES = [
    pytest.param({"max_bytes": 3}, part(data=b"four"), PolicyRule.MAX_BYTES, id="max_bytes"),
    pytest.param(
        {"denied_types": ("application/*",)},
        part(content_type="application/pdf"),
        PolicyRule.DENIED_TYPE,
        id="denied_type_wildcard",
    ),
    pytest.param(
        {"denied_types": ("text/html",)},
        part(content_type="Text/HTML; charset=utf-8"),
        PolicyRule.DENIED_TYPE,
        id="denied_type_case_and_parameters",
    ),
    pytest.param(
        {"allowed_types": ("image/*", "application/pdf")},
        part(content_type="text/plain"),
        PolicyRule.TYPE_NOT_ALLOWED,
        id="type_not_allowed",
    ),
    pytest.param(
        {"denied_extensions": frozenset({"exe"})},
        part(name="invoice.pdf.exe"),
        PolicyRule.DENIED_EXTENSION,
        id="denied_extension",
    ),
]


@pytest.mark.parametrize(("rules", "breaking", "rule"), CASES)
def test_drop_leaves_the_breaking_attachment_out(
    rules: dict[str, object], breaking: MimePart, rule: PolicyRule
) -> None:
    ok = part(name="ok.png", content_type="image/png", data=b"ok")
    screened = policy(**rules).screen([ok, breaking])
    assert screened.kept == (ok,)
    assert screened.dropped == (Dropped(part=breaking, rule=rule),)


@pytest.mark.parametrize(("rules", "breaking", "rule"), CASES)
def test_reject_raises_for_the_breaking_attachment(
    rules: dict[str, object], breaking: MimePart, rule: PolicyRule
) -> None:
    with pytest.raises(AttachmentRejected) as caught:
        policy(action=PolicyAction.REJECT, **rules).screen([part(name="ok.png", content_type="image/png"), breaking])
    assert (caught.value.rule, caught.value.filename, caught.value.size) == (
        rule.value,
        breaking.filename,
        len(breaking.data),
    )
    assert isinstance(caught.value, AttachmentTooLarge) == (rule is PolicyRule.MAX_BYTES)


def test_size_at_the_limit_passes() -> None:
    assert policy(max_bytes=4).screen([part(data=b"four")]).dropped == ()


def test_count_keeps_the_first_ones_in_message_order() -> None:
    parts = [part(name=f"{n}.txt") for n in range(5)]
    screened = policy(max_count=2).screen(parts)
    assert screened.kept == tuple(parts[:2])
    assert [(d.part.filename, d.rule) for d in screened.dropped] == [
        (f"{n}.txt", PolicyRule.MAX_COUNT) for n in (2, 3, 4)
    ]
    with pytest.raises(AttachmentRejected) as caught:
        policy(max_count=2, action=PolicyAction.REJECT).screen(parts)
    assert (caught.value.rule, caught.value.filename) == ("max_count", "2.txt")


def test_count_zero_delivers_no_attachment() -> None:
    assert policy(max_count=0).screen([part()]).kept == ()


def test_total_keeps_what_fits_in_message_order() -> None:
    parts = [part(name="a", data=b"x" * 6), part(name="b", data=b"x" * 6), part(name="c", data=b"x" * 4)]
    screened = policy(max_total_bytes=10).screen(parts)
    assert [p.filename for p in screened.kept] == ["a", "c"]
    assert [(d.part.filename, d.rule) for d in screened.dropped] == [("b", PolicyRule.MAX_TOTAL_BYTES)]
    with pytest.raises(AttachmentRejected) as caught:
        policy(max_total_bytes=10, action=PolicyAction.REJECT).screen(parts)
    assert (caught.value.rule, caught.value.filename) == ("max_total_bytes", "b")


def test_dropped_attachments_do_not_count_towards_count_or_total() -> None:
    parts = [part(name="evil.exe", data=b"x" * 9), part(name="a.txt", data=b"x" * 9)]
    screened = policy(max_count=1, max_total_bytes=10, denied_extensions=frozenset({"exe"})).screen(parts)
    assert [p.filename for p in screened.kept] == ["a.txt"]


def test_a_thousand_tiny_attachments() -> None:
    parts = [part(name=f"{n}.txt", data=b"x") for n in range(1000)]
    assert len(policy().screen(parts).kept) == 1000
    screened = policy(max_count=10).screen(parts)
    assert (len(screened.kept), len(screened.dropped)) == (10, 990)


@pytest.mark.parametrize(
    ("filename", "expected"),
    [
        ("report.pdf", {"pdf"}),
        ("invoice.PDF.Exe", {"pdf", "exe"}),
        ("invoice.exe.pdf", {"exe", "pdf"}),
        ("../../windows/evil.exe", {"exe"}),
        ("C:\\Users\\x\\evil.bat", {"bat"}),
        ("evil.exe\x00.pdf", {"exe", "pdf"}),
        ("evil.exe. . ", {"exe"}),
        ("evil.exe::$DATA", {"exe"}),
        ("evil\u202egpj.exe", {"exe"}),  # right-to-left override: shows as "evilexe.jpg"
        ("ｅｖｉｌ.ＥＸＥ", {"exe"}),  # full-width letters fold to ASCII (NFKC)
        (".bashrc", {"bashrc"}),
        ("noextension", set()),
        ("a" * 500 + ".js", {"js"}),
        (None, set()),
    ],
)
def test_extensions(filename: str | None, expected: set[str]) -> None:
    assert extensions(filename) == expected


def test_rfc2231_encoded_name_is_matched_decoded() -> None:
    raw = (
        b"Content-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\nhi\r\n"
        b"--b\r\nContent-Type: application/octet-stream\r\n"
        b"Content-Disposition: attachment; filename*0*=UTF-8''r%C3%A9sum%C3%A9; filename*1*=%2Epdf%2Eexe\r\n\r\n"
        b"data\r\n--b--\r\n"
    )
    (attachment,) = parse_message(raw).parts
    assert attachment.filename == "résumé.pdf.exe"
    screened = policy(denied_extensions=frozenset({"exe"})).screen([attachment])
    assert screened.dropped == (Dropped(part=attachment, rule=PolicyRule.DENIED_EXTENSION),)


def test_a_lying_content_type_is_caught_by_the_sniffed_type() -> None:
    """A Windows program declared as image/png: the type rules see both the declared and the detected type."""
    liar = part(name="photo.png", content_type="image/png", data=PE)
    assert policy(allowed_types=("image/*",)).screen([liar]).dropped == (
        Dropped(part=liar, rule=PolicyRule.TYPE_NOT_ALLOWED),
    )
    assert policy(denied_types=(PE_TYPE,)).screen([liar]).dropped == (Dropped(part=liar, rule=PolicyRule.DENIED_TYPE),)
    honest = part(name="photo.png", content_type="image/png", data=b"\x89PNG\r\n\x1a\n")
    assert policy(allowed_types=("image/*",), denied_types=(PE_TYPE,)).screen([honest]).kept == (honest,)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (PE, PE_TYPE),
        (b"\x7fELF\x02\x01\x01", ELF_TYPE),
        (b"\xcf\xfa\xed\xfe\x07", MACHO_TYPE),
        (b"MZ but only text, not a program", None),
        (b"MZ" + b"\x00" * 58 + struct.pack("<I", 10**9), None),  # PE offset past the end
        (b"", None),
        (b"%PDF-1.7", None),
    ],
)
def test_sniff_executable(data: bytes, expected: str | None) -> None:
    assert sniff_executable(data) == expected


def test_type_matching() -> None:
    assert normalize_type(" Application/PDF ; name=x.pdf") == "application/pdf"
    assert type_matches("image/png", ["image/*"])
    assert type_matches("image/png", ["*/*"])
    assert not type_matches("imagex/png", ["image/*"])
    assert not type_matches("application/pdf", ["application/pdfx"])
