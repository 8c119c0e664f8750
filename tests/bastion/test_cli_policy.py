"""``bastion policy test`` and ``bastion policy matrix`` against the documents example."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion._cli import main
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "documents_api"
APP = ["--app", "examples.documents_api:service"]


def test_the_examples_cases_pass_with_coverage(capsys: pytest.CaptureFixture[str]) -> None:
    cases = str(EXAMPLE / "policy-cases.toml")
    assert main(["policy", "test", str(EXAMPLE / "policies.cedar"), *APP, "--cases", cases]) == 0
    out = capsys.readouterr().out
    assert "7 passed, 0 failed\n" in out
    assert '  policies that decided no case: statement 1 (line 11), @id("openapi-public")\n' in out
    assert "  actions no policy permits for any principal of the cases (0):\n" in out


def test_a_mismatch_exits_1_and_names_the_case(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = tmp_path / "cases.toml"
    cases.write_text(
        '[[case]]\nname = "user reads the user list"\nprincipal = { sub = "alice", roles = ["user"] }\n'
        'action = "GET /api/v2/admin/users"\nexpect = "allow"\n'
    )
    assert main(["policy", "test", str(EXAMPLE / "policies.cedar"), *APP, "--cases", str(cases)]) == 1
    out = capsys.readouterr().out
    assert "FAIL user reads the user list: expected allow, got deny by admin-users-admins-only\n" in out
    assert "0 passed, 1 failed\n" in out
    # Only alice is a principal of the cases: the admin-only routes are permitted to nobody in them.
    assert "    GET /api/v2/admin/users\n" in out


def test_a_case_naming_no_action_of_the_service_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = tmp_path / "cases.toml"
    cases.write_text('[[case]]\nname = "typo"\naction = "GET /api/v9/documents"\nexpect = "deny"\n')
    assert main(["policy", "test", str(EXAMPLE / "policies.cedar"), *APP, "--cases", str(cases)]) == 2
    assert capsys.readouterr().err == (
        f"error: cases file {str(cases)!r}: case 'typo': action 'GET /api/v9/documents' is not one the service "
        "decides\n"
    )


def test_a_malformed_case_file_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = tmp_path / "cases.toml"
    cases.write_text('[[case]]\nname = "x"\naction = "GET /api/v2/documents"\nexpect = "maybe"\n')
    assert main(["policy", "test", str(EXAMPLE / "policies.cedar"), *APP, "--cases", str(cases)]) == 2
    assert capsys.readouterr().err == (
        f"error: cases file {str(cases)!r}: case 1 ('x'), field 'expect': expected one of allow, deny, error, "
        "got 'maybe'\n"
    )


def test_matrix_prints_who_can_call_what(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "matrix", str(EXAMPLE / "policies.cedar"), *APP]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["action", "anonymous", "user", "admin"]
    rows = {line.rsplit(None, 3)[0].strip(): line.split()[-3:] for line in lines[1:]}
    assert rows["GET /api/v2/documents"] == ["-", "any", "any"]
    assert rows["GET /api/v2/documents/{user_id}/{doc_id}"] == ["-", "own", "any"]
    assert rows["GET /api/v2/admin/users"] == ["-", "-", "any"]
    assert rows["/documents.v1.DocumentService/GetDocument"] == ["-", "own", "any"]
