"""Policy test cases: loading (errors name the file, case and field), running, the schema check, the matrix."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion.errors import ConfigError
from bastion.policy import _cases as cases_module
from bastion.policy._cases import load_cases, run_case, schema_problems
from bastion.policy._engine import parse_policies
from bastion.policy._matrix import ANY, NONE, OWN, matrix, role_probes, roles_named
from bastion.policy._schema import ActionShape, PolicySchema

POLICIES = parse_policies(
    """
@id("admin-any")
permit(principal, action, resource) when { principal.roles.contains("admin") };
@id("owner")
permit(principal is User, action == Action::"GET /api/v1/docs/{owner_id}", resource)
when { principal has sub && principal.sub == resource.owner_id };
@id("no-deletes")
forbid(principal, action == Action::"DELETE /api/v1/docs/{owner_id}", resource)
unless { principal.roles.contains("root") };
"""
)
SCHEMA = PolicySchema(
    actions=(
        ActionShape(name="GET /api/v1/docs/{owner_id}", attributes={"owner_id": "String"}),
        ActionShape(name="DELETE /api/v1/docs/{owner_id}", attributes={"owner_id": "String"}),
    )
)
GOOD = """
[[case]]
name = "owner reads"
principal = { sub = "alice", roles = ["user"] }
action = "GET /api/v1/docs/{owner_id}"
resource = { owner_id = "alice" }
expect = "allow"
decided_by = "owner"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cases.toml"
    path.write_text(text)
    return path


def test_a_case_runs_with_its_decision_and_deciding_id(tmp_path: Path) -> None:
    (case,) = load_cases(write(tmp_path, GOOD))
    result = run_case(POLICIES, case)
    assert (result.outcome, result.deciding, result.passed) == ("allow", ("owner",), True)


def test_a_wrong_deciding_id_fails_the_case(tmp_path: Path) -> None:
    (case,) = load_cases(write(tmp_path, GOOD.replace('decided_by = "owner"', 'decided_by = "admin-any"')))
    result = run_case(POLICIES, case)
    assert not result.passed
    assert result.line() == "FAIL owner reads: expected allow by admin-any, got allow by owner"


def test_a_forbid_decides_a_deny(tmp_path: Path) -> None:
    text = GOOD.replace("GET /api", "DELETE /api").replace('"allow"', '"deny"').replace('"owner"', '"no-deletes"')
    text = text.replace('roles = ["user"]', 'roles = ["admin"]')
    (case,) = load_cases(write(tmp_path, text))
    assert run_case(POLICIES, case).passed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            GOOD.replace('expect = "allow"', 'expect = "yes"'), "case 1 ('owner reads'), field 'expect'", id="expect"
        ),
        pytest.param(
            GOOD.replace("action =", "acton ="),
            "case 1 ('owner reads'), field 'acton': unknown field",
            id="unknown-field",
        ),
        pytest.param(GOOD.replace('name = "owner reads"\n', ""), "case 1, field 'name'", id="no-name"),
        pytest.param(GOOD.replace("sub =", "sbu ="), "field 'principal.sbu': unknown claim", id="claim"),
        pytest.param(GOOD.replace('roles = ["user"]', 'roles = "user"'), "field 'principal.roles'", id="roles"),
        pytest.param(GOOD.replace('"owner"', "3"), "field 'decided_by'", id="decided-by"),
        pytest.param(GOOD + GOOD, "case 2 ('owner reads'), field 'name': the name is used", id="duplicate"),
        pytest.param("[[case]\n", "is not TOML", id="toml"),
        pytest.param("title = 1\n", "unknown table 'title'", id="table"),
    ],
)
def test_a_malformed_case_names_the_file_case_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_cases(path)
    assert str(caught.value).startswith(f"cases file {str(path)!r}")
    assert message in str(caught.value)


def test_cases_are_checked_against_the_schema(tmp_path: Path) -> None:
    text = GOOD + GOOD.replace("owner reads", "typo").replace("{owner_id}", "{id}")
    text += GOOD.replace("owner reads", "int").replace('owner_id = "alice"', "owner_id = 1")
    assert schema_problems(load_cases(write(tmp_path, text)), SCHEMA) == [
        "case 'typo': action 'GET /api/v1/docs/{id}' is not one the service decides",
        "case 'int': resource.owner_id: expected a String, got 1",
    ]


def test_matrix_tells_any_from_own() -> None:
    assert roles_named(POLICIES) == ["admin", "root"]
    probes = role_probes(roles_named(POLICIES))
    assert [probe.label for probe in probes] == ["anonymous", "user", "admin", "root"]
    assert matrix(POLICIES, SCHEMA.actions, probes) == [[NONE, OWN, ANY, OWN], [NONE, NONE, NONE, NONE]]


def test_a_file_over_the_case_cap_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cases_module, "MAX_CASES", 2)
    text = "".join(GOOD.replace("owner reads", f"case {number}") for number in range(3))
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_cases(path)
    assert str(caught.value) == f"cases file {str(path)!r} has 3 cases; at most 2"
