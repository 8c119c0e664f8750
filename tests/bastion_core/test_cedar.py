"""The core's Cedar wrapper: one-line load errors, fail-closed decisions."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion_core import ConfigError
from bastion_core._cedar import MAX_POLICY_FILE_BYTES, cedar_decide, load_cedar_policies

PRINCIPAL = ("Sender", "al@example.org", {"domain": "example.org"})
RESOURCE = ("Route", "billing", {"name": "billing"})


def test_forbid_wins_and_names_its_id(tmp_path: Path) -> None:
    loaded = load_cedar_policies(
        _write(
            tmp_path,
            '@id("all") permit (principal, action, resource);\n@id("no-billing") forbid '
            '(principal, action, resource == Route::"billing");',
        ),
        origin="P",
    )
    decision = cedar_decide(loaded, principal=PRINCIPAL, action="Receive", resource=RESOURCE, context={})
    assert (decision.allowed, decision.reasons, decision.errors) == (False, ("no-billing",), ())


def test_evaluation_error_denies_even_when_a_permit_matches(tmp_path: Path) -> None:
    """A forbid that errors (a missing attribute) is skipped by Cedar; the wrapper denies instead."""
    loaded = load_cedar_policies(
        _write(
            tmp_path,
            "permit (principal, action, resource);\nforbid (principal, action, resource) when "
            "{ principal.missing == 1 };",
        ),
        origin="P",
    )
    decision = cedar_decide(loaded, principal=PRINCIPAL, action="Receive", resource=RESOURCE, context={})
    assert decision.allowed is False
    assert len(decision.errors) == 1


def test_ip_context_values_work(tmp_path: Path) -> None:
    loaded = load_cedar_policies(
        _write(tmp_path, 'permit (principal, action, resource) when { context.ip.isInRange(ip("10.0.0.0/8")) };'),
        origin="P",
    )
    inside = {"ip": {"__extn": {"fn": "ip", "arg": "10.1.2.3"}}}
    outside = {"ip": {"__extn": {"fn": "ip", "arg": "192.0.2.1"}}}

    def decide(context: dict[str, object]) -> bool:
        return cedar_decide(loaded, principal=PRINCIPAL, action="Receive", resource=RESOURCE, context=context).allowed

    assert (decide(inside), decide(outside)) == (True, False)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        pytest.param("permit (principal, action, resource", "P: does not parse as Cedar (", id="syntax"),
        pytest.param("// nothing\n", "P: has no policies; everything would be denied", id="empty"),
        pytest.param("x" * (MAX_POLICY_FILE_BYTES + 1), f"P: over {MAX_POLICY_FILE_BYTES} bytes", id="too-big"),
    ],
)
def test_bad_file_is_one_line(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_cedar_policies(_write(tmp_path, text), origin="P")
    message = str(caught.value)
    assert message.startswith(error)
    assert "\n" not in message


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_cedar_policies(tmp_path / "absent.cedar", origin="P")
    assert str(caught.value) == "P: cannot read the file (No such file or directory)"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.cedar"
    path.write_text(text)
    return path
