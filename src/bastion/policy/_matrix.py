"""Who can call what: the roles the policies name, each probed on every action of a service's schema
(``bastion policy matrix``, the coverage of ``bastion policy test``, the OpenAPI operations' permitted roles)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bastion.policy._capability import ANONYMOUS_PRINCIPAL, PRINCIPAL_TYPE, RESOURCE_TYPE, action_context
from bastion.policy._engine import LoadedPolicies, evaluate
from bastion.policy._schema import ActionShape

ANY, OWN, NONE = "any", "own", "-"
"""A matrix cell: allowed on any resource, only where its string attributes name the caller, or not at all."""
OTHER_OWNER = "someone-else"
_ROLE_SETS = ("contains", "containsAll", "containsAny")
_PROBE_CONTEXT: Mapping[str, Any] = {"ip_address": "127.0.0.1", "timestamp": 0, "user_agent": "", "request_id": ""}
_PLACEHOLDER = {"Long": 0, "Boolean": False}
_PARAMETER = re.compile(r"\{([^}]+)\}")
MAX_NOTED_ACTIONS = 4096
"""Cached OpenAPI notes (one per operation and policy digest) before the cache starts over."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    """A column of the matrix: a principal and how it is labelled."""

    label: str
    principal: tuple[str, str, dict[str, Any]]


def roles_named(policies: LoadedPolicies) -> list[str]:
    """The role names the policies test (``principal.roles.contains("admin")``, ``context.roles``, sets), sorted."""
    found: set[str] = set()

    def strings(value: object) -> Iterable[str]:
        if isinstance(value, dict):
            if isinstance(value.get("Value"), str):
                yield value["Value"]
            for item in value.get("Set", ()) if isinstance(value.get("Set"), list) else ():
                yield from strings(item)

    def walk(value: object) -> None:
        if isinstance(value, dict):
            for key in _ROLE_SETS:
                inner = value.get(key)
                if isinstance(inner, dict):
                    access = inner.get("left", {}).get(".", {})
                    if isinstance(access, dict) and access.get("attr") == "roles":
                        found.update(strings(inner.get("right")))
            for child in value.values():
                walk(child)
        elif isinstance(value, list):
            for child in value:
                walk(child)

    walk(dict(policies.document))
    return sorted(found)


def role_probes(roles: Iterable[str]) -> list[Probe]:
    """Anonymous, an authenticated user without roles, then one user per role."""
    probes = [
        Probe(label="anonymous", principal=ANONYMOUS_PRINCIPAL),
        Probe(label="user", principal=(PRINCIPAL_TYPE, "probe-user", {"sub": "probe-user", "roles": [], "perms": []})),
    ]
    for role in roles:
        sub = f"probe-{role}"
        probes.append(Probe(label=role, principal=(PRINCIPAL_TYPE, sub, {"sub": sub, "roles": [role], "perms": []})))
    return probes


def cell(policies: LoadedPolicies, probe: Probe, action: ActionShape) -> str:
    """ANY when allowed on a resource owned by someone else, OWN when only on one whose string attributes are the
    caller's id, NONE otherwise (context: the action's method, path and version, the caller's roles)."""
    principal = probe.principal
    context = {**_PROBE_CONTEXT, **action_context(action.name), "roles": list(principal[2].get("roles", []))}
    results = []
    for owner in (OTHER_OWNER, principal[1]):
        resource = {name: _PLACEHOLDER.get(kind, owner) for name, kind in action.attributes.items()}
        decision = evaluate(
            policies,
            principal=principal,
            action=action.name,
            resource=(RESOURCE_TYPE, "probe", resource),
            context=context,
        )
        results.append(decision.allowed)
    return ANY if results[0] else OWN if results[1] else NONE


def matrix(policies: LoadedPolicies, actions: Sequence[ActionShape], probes: Sequence[Probe]) -> list[list[str]]:
    """One row per action: its cell for each probe."""
    return [[cell(policies, probe, action) for probe in probes] for action in actions]


def render(actions: Sequence[ActionShape], probes: Sequence[Probe], rows: Sequence[Sequence[str]]) -> list[str]:
    """The matrix as aligned text lines: the action, then one column per probe."""
    width = max([len("action"), *(len(action.name) for action in actions)])
    widths = [max(len(probe.label), 3) for probe in probes]
    head = "action".ljust(width) + "".join(f"  {probe.label.ljust(w)}" for probe, w in zip(probes, widths, strict=True))
    lines = [head.rstrip()]
    for action, row in zip(actions, rows, strict=True):
        cells = "".join(f"  {value.ljust(w)}" for value, w in zip(row, widths, strict=True))
        lines.append((action.name.ljust(width) + cells).rstrip())
    return lines


def permitted_roles(policies: LoadedPolicies, actions: Sequence[ActionShape]) -> dict[str, dict[str, str]]:
    """``{action: {probe label: "any" | "own"}}`` for the probes the policies allow (OpenAPI's note)."""
    probes = role_probes(roles_named(policies))
    return {
        action.name: {probe.label: value for probe, value in zip(probes, row, strict=True) if value != NONE}
        for action, row in zip(actions, matrix(policies, actions, probes), strict=True)
    }


class OperationRoles:
    """What each OpenAPI operation notes: ``{probe label: "any" | "own"}`` for ``"<METHOD> <template>"``, from
    the policies in force now (``current()``), computed once per action and policy digest.

    The probe's resource has the template's ``{parameters}`` as strings plus the attributes an extractor
    declared for the template (``declared``).
    """

    def __init__(self, current: Callable[[], LoadedPolicies], declared: Mapping[str, Mapping[str, str]]) -> None:
        self.current = current
        self.declared = declared
        self._cache: dict[tuple[str, str], dict[str, str]] = {}

    @property
    def digest(self) -> str:
        return self.current().digest

    def __call__(self, action: str) -> dict[str, str]:
        policies = self.current()
        key = (policies.digest, action)
        found = self._cache.get(key)
        if found is None:
            template = action.partition(" ")[2]
            attributes = {name.split(":", 1)[0]: "String" for name in _PARAMETER.findall(template)}
            attributes.update(self.declared.get(action) or self.declared.get(template) or {})
            found = permitted_roles(policies, [ActionShape(name=action, attributes=attributes)])[action]
            if len(self._cache) >= MAX_NOTED_ACTIONS:
                self._cache.clear()  # a reload changed the digest: the old entries are dead
            self._cache[key] = found
        return found
