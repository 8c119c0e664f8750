"""Policy test cases (``bastion policy test``): a TOML file of principal, action, resource and context with the
expected decision and deciding ``@id``, loaded with errors that name the file, case and field, and run offline."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bastion.errors import ConfigError
from bastion.policy._capability import ANONYMOUS_PRINCIPAL, PRINCIPAL_TYPE, RESOURCE_TYPE, action_context
from bastion.policy._engine import LoadedPolicies, evaluate
from bastion.policy._schema import USER_ATTRIBUTES, PolicySchema

EXPECTATIONS = ("allow", "deny", "error")
CASE_KEYS = frozenset({"name", "principal", "action", "resource", "resource_id", "context", "expect", "decided_by"})
MAX_CASES = 10_000
"""Cases in one file: a bound on what ``bastion policy test`` (and a suite using the helper) evaluates."""
DEFAULT_CONTEXT: Mapping[str, Any] = {
    "ip_address": "127.0.0.1",
    "timestamp": 0,
    "user_agent": "",
    "request_id": "policy-test",
}
"""What a case's context holds unless it says otherwise (``method``, ``path``, ``version`` come from the action,
``roles`` from the principal)."""
_CEDAR_PY = {"String": str, "Long": int, "Boolean": bool}


class CaseError(ConfigError):
    """A malformed case file: the message names the file, the case and the field."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyCase:
    """One request and the decision the policies must reach for it."""

    name: str
    principal: tuple[str, str, dict[str, Any]]
    action: str
    resource: dict[str, Any]
    resource_id: str
    context: dict[str, Any]
    expect: str
    decided_by: frozenset[str] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseResult:
    case: PolicyCase
    outcome: str
    deciding: tuple[str, ...]
    errors: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        expected = self.case.decided_by
        return self.outcome == self.case.expect and (expected is None or expected == frozenset(self.deciding))

    def line(self) -> str:
        verdict = "ok  " if self.passed else "FAIL"
        got = f"{self.outcome}" + (f" by {', '.join(sorted(self.deciding))}" if self.deciding else "")
        want = self.case.expect
        if self.case.decided_by is not None:
            want += f" by {', '.join(sorted(self.case.decided_by)) or '(no policy)'}"
        detail = "" if self.passed else f": expected {want}, got {got}"
        return f"{verdict} {self.case.name}{detail}" + "".join(f"\n       error: {e}" for e in self.errors)


def _where(origin: str, index: int, name: str | None, field: str) -> str:
    label = f"case {index}" + (f" ({name!r})" if name else "")
    return f"{origin}: {label}, field {field!r}"


def load_cases(path: str | Path) -> list[PolicyCase]:
    """Read ``[[case]]`` tables from ``path``; CaseError naming the file, case and field for anything malformed."""
    origin = f"cases file {str(path)!r}"
    try:
        document = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CaseError(f"{origin}: cannot read the file ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise CaseError(f"{origin} is not TOML: {exc}") from None
    extra = sorted(set(document) - {"case"})
    if extra:
        raise CaseError(f"{origin}: unknown table {extra[0]!r} (cases are [[case]] tables)")
    raw = document.get("case")
    if not isinstance(raw, list) or not raw:
        raise CaseError(f"{origin} has no [[case]] tables")
    if len(raw) > MAX_CASES:
        raise CaseError(f"{origin} has {len(raw)} cases; at most {MAX_CASES}")
    cases = [_case(origin, index, table) for index, table in enumerate(raw, start=1)]
    seen: set[str] = set()
    for index, case in enumerate(cases, start=1):
        if case.name in seen:
            raise CaseError(f"{_where(origin, index, case.name, 'name')}: the name is used by an earlier case")
        seen.add(case.name)
    return cases


def _case(origin: str, index: int, table: Mapping[str, Any]) -> PolicyCase:
    name = table.get("name")

    def where(field: str) -> str:
        return _where(origin, index, name if isinstance(name, str) else None, field)

    if not isinstance(name, str) or not name.strip():
        raise CaseError(f"{where('name')}: expected a non-empty string")
    unknown = sorted(set(table) - CASE_KEYS)
    if unknown:
        raise CaseError(f"{where(unknown[0])}: unknown field (fields: {', '.join(sorted(CASE_KEYS))})")
    action = table.get("action")
    if not isinstance(action, str) or not action.strip():
        raise CaseError(f'{where("action")}: expected an action such as "GET /api/v1/documents"')
    expect = table.get("expect")
    if expect not in EXPECTATIONS:
        raise CaseError(f"{where('expect')}: expected one of {', '.join(EXPECTATIONS)}, got {expect!r}")
    principal = _principal(table.get("principal"), where)
    resource = _table(table.get("resource", {}), where("resource"))
    context = _table(table.get("context", {}), where("context"))
    resource_id = table.get("resource_id", action.partition(" ")[2] or action)
    if not isinstance(resource_id, str):
        raise CaseError(f"{where('resource_id')}: expected a string")
    decided_by = table.get("decided_by")
    if isinstance(decided_by, str):
        decided_by = [decided_by]
    if decided_by is not None and not (isinstance(decided_by, list) and all(isinstance(i, str) for i in decided_by)):
        raise CaseError(f"{where('decided_by')}: expected an @id or a list of them")
    full_context = {
        **DEFAULT_CONTEXT,
        **action_context(action),
        "roles": list(principal[2]["roles"]),
        **context,
    }
    return PolicyCase(
        name=name,
        principal=principal,
        action=action,
        resource=resource,
        resource_id=resource_id,
        context=full_context,
        expect=expect,
        decided_by=None if decided_by is None else frozenset(decided_by),
    )


def _table(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CaseError(f"{where}: expected a table")
    return dict(value)


def _principal(value: object, where: Callable[[str], str]) -> tuple[str, str, dict[str, Any]]:
    """``User::<sub>`` from a table of claims; absent: the anonymous principal."""
    if value is None:
        return ANONYMOUS_PRINCIPAL
    claims = _table(value, where("principal"))
    unknown = sorted(set(claims) - set(USER_ATTRIBUTES))
    if unknown:
        raise CaseError(f"{where('principal.' + unknown[0])}: unknown claim (claims: {', '.join(USER_ATTRIBUTES)})")
    for name in ("roles", "perms"):
        listed = claims.setdefault(name, [])
        if not isinstance(listed, list) or not all(isinstance(item, str) for item in listed):
            raise CaseError(f"{where('principal.' + name)}: expected a list of strings")
    for name in ("sub", "username", "email", "client_id"):
        if name in claims and not isinstance(claims[name], str):
            raise CaseError(f"{where('principal.' + name)}: expected a string")
    return PRINCIPAL_TYPE, str(claims.get("sub") or claims.get("client_id") or "anonymous"), claims


def schema_problems(cases: Sequence[PolicyCase], schema: PolicySchema) -> list[str]:
    """Cases that do not fit the service: an action it does not decide, resource attributes its routes lack or
    type otherwise (one line each)."""
    shapes = {action.name: action for action in schema.actions}
    problems: list[str] = []
    for case in cases:
        shape = shapes.get(case.action)
        if shape is None:
            if not schema.open_actions:
                problems.append(f"case {case.name!r}: action {case.action!r} is not one the service decides")
            continue
        for name, value in case.resource.items():
            kind = shape.attributes.get(name)
            if kind is None and not shape.open:
                known = ", ".join(sorted(shape.attributes)) or "none"
                problems.append(f"case {case.name!r}: resource.{name}: {case.action!r} has no such attribute ({known})")
            elif kind is not None and type(value) is not _CEDAR_PY[kind]:
                problems.append(f"case {case.name!r}: resource.{name}: expected a {kind}, got {value!r}")
        missing = sorted(set(shape.attributes) - set(case.resource))
        if missing:
            problems.append(f"case {case.name!r}: resource lacks {', '.join(missing)} (every request has them)")
    return problems


def run_case(policies: LoadedPolicies, case: PolicyCase) -> CaseResult:
    decision = evaluate(
        policies,
        principal=case.principal,
        action=case.action,
        resource=(RESOURCE_TYPE, case.resource_id, case.resource),
        context=case.context,
    )
    outcome = "error" if decision.failed else "allow" if decision.allowed else "deny"
    return CaseResult(case=case, outcome=outcome, deciding=decision.reasons, errors=decision.errors)
