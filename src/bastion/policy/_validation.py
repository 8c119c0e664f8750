"""Policies validated against a service's schema with Cedar's validator (strict mode), errors told by ``@id``.

Cedar finds a misspelled attribute (``principal.role``), an action no route makes (``Action::"GET
/api/v2/nope"``) or a type error before any request does (a claim read without ``has`` is only a warning: see
``_claim_may_be_absent``). Its messages name policies ``policy0``, ``policy1``, ...; each problem here names the
statement, its line and its ``@id``.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import cedarpy
import structlog

from bastion.policy._capability import ANONYMOUS_TYPE, PRINCIPAL_TYPE, RESOURCE_TYPE
from bastion.policy._engine import LoadedPolicies, PolicyValidationError, split_statements
from bastion.policy._schema import (
    ANONYMOUS_ATTRIBUTES,
    CONTEXT_ATTRIBUTES,
    USER_ATTRIBUTES,
    ActionShape,
    PolicySchema,
    cedar_schema,
)

log = structlog.get_logger("bastion.policy")

_FOR_POLICY = re.compile(r"^for policy `policy\d+`, ")
_FOR_ACTION = re.compile(r' for Action::"(?:[^"\\]|\\.)*"')
_NOT_FOUND = re.compile(r"attribute `([^`]+)` (?:on entity type `([^`]+)`|in context) not found")
_UNRECOGNIZED_ACTION = "unrecognized action"
_NO_APPLICABLE_ACTION = "unable to find an applicable action"

Shape = tuple[frozenset[tuple[str, str]], bool]
"""A resource's attributes (name, Cedar type) and whether an undeclared extractor may add more."""


def check_policies(schema: PolicySchema, policies: LoadedPolicies) -> None:
    """Raise PolicyValidationError (one line per problem, the first in its message) unless ``policies``
    validate against ``schema``; log its warnings (``policy_actions_without_route``)."""
    errors, warnings = validate(schema, policies)
    if errors:
        raise PolicyValidationError(policies.origin, tuple(errors))
    if warnings:
        log.warning("policy_validation_warnings", policies=policies.origin, warnings=warnings)


def validate(schema: PolicySchema, policies: LoadedPolicies) -> tuple[list[str], list[str]]:
    """``(errors, warnings)`` of ``policies`` against ``schema``: one line each, naming statement, line, ``@id``.

    Actions whose resources have the same attributes form a group, validated with a schema where
    ``Resource`` has exactly those attributes, all required, and only that group's actions apply:
    ``resource.owner_id`` needs no ``has`` guard in a policy about routes that always carry it, and is an
    error in one that also covers routes without it. Each group sees the policies whose scope can match one
    of its actions (Cedar calls a policy that can match no action an error).
    """
    actions = list(schema.actions)
    known = {action.name for action in actions}
    unknown = [name for name in named_actions(policies) if name not in known]
    warnings: list[str] = []
    if schema.open_actions and unknown:
        actions += [ActionShape(name=name) for name in unknown]
        warnings = [
            f"Action::{json.dumps(name)} names no route: only the fallback or a frontend route can serve it"
            for name in unknown
        ]
    groups: dict[Shape, list[str]] = {}
    for action in actions:
        groups.setdefault((frozenset(action.attributes.items()), action.open), []).append(action.name)
    scopes = _scopes(policies.document)
    texts = {f"policy{number - 1}": text for number, _, text in split_statements(policies.text)}
    declared = [action.name for action in actions]
    everything = set(declared)
    found: dict[str, set[str]] = {}
    for position, (shape, applicable) in enumerate(groups.items() or [((frozenset(), False), [])]):
        names = set(applicable)
        # A policy naming only unknown actions is validated once, with the first group (Cedar names them).
        subset = [
            policy_id
            for policy_id, scope in scopes.items()
            if scope is None or scope & names or (position == 0 and not scope & everything)
        ]
        for policy_id, message in _group_errors(
            policies.document, texts, shape, applicable, declared, subset, services=schema.service_principals
        ):
            found.setdefault(policy_id, set()).add(message)
    order = list(scopes)
    errors: list[str] = []
    for policy_id in sorted(found, key=lambda policy_id: order.index(policy_id) if policy_id in order else -1):
        for message in _tidy(found[policy_id]):
            line = f"{policies.label(policy_id) if policy_id else 'policies'}: {message}"
            (warnings if _claim_may_be_absent(message) else errors).append(line)
    return errors, warnings


def _claim_may_be_absent(message: str) -> bool:
    """A read of a claim a token may lack (``principal.sub`` without ``principal has sub``, as the spec's
    ownership example is written): a warning, not an error. Such a read was always allowed: a caller without
    the claim makes the evaluation fail, and a failure denies (``POLICY_ERROR``). A misspelled or unknown
    attribute stays an error."""
    if _OPTIONAL_ACCESS in message and f"on entity type `{PRINCIPAL_TYPE}`" in message:
        return True
    match = _NOT_FOUND.search(message)
    return match is not None and match.group(2) == ANONYMOUS_TYPE and match.group(1) in USER_ATTRIBUTES


def _group_errors(
    document: Mapping[str, Any],
    texts: Mapping[str, str],
    shape: Shape,
    applicable: list[str],
    declared: list[str],
    subset: list[str],
    *,
    services: bool = False,
) -> Iterable[tuple[str, str]]:
    """``(policy id, message)`` for each error Cedar finds in the ``subset`` of policies (ids to their ``texts``)
    for one group of actions: ``applicable`` of all ``declared``, on resources of ``shape``."""
    if not subset:
        return
    attributes, open_resource = shape
    schema = cedar_schema(
        resource={name: (kind, True) for name, kind in sorted(attributes)},
        applicable=applicable,
        declared=declared,
        services=services,
    )
    result = cedarpy.validate_policies("\n".join(texts[policy_id] for policy_id in subset), json.dumps(schema))
    # What an undeclared extractor may add: whatever these policies read on the resource that the shape lacks.
    present = {name for name, _ in attributes}
    undeclared = _resource_reads(document, subset) - present if open_resource else set()
    for error in result.errors:
        # Every action has the same context: the one Cedar happened to name would mislead.
        message = _FOR_ACTION.sub("", _FOR_POLICY.sub("", error.error))
        if any(f"attribute `{name}` on entity type `{RESOURCE_TYPE}`" in message for name in undeclared):
            continue
        policy_id = subset[int(error.policy_id.removeprefix("policy"))] if error.policy_id else ""
        yield policy_id, message + _suggestion(message, present)


def named_actions(policies: LoadedPolicies) -> list[str]:
    """Every ``Action::"..."`` the policies name (scope and conditions), once each, in file order."""
    found: dict[str, None] = {}

    def walk(value: object) -> None:
        if isinstance(value, dict):
            if value.get("type") == "Action" and isinstance(value.get("id"), str):
                found[value["id"]] = None
                return
            for child in value.values():
                walk(child)
        elif isinstance(value, list):
            for child in value:
                walk(child)

    for policy in _policies(policies.document).values():
        walk(policy)
    return list(found)


def _policies(document: Mapping[str, Any]) -> dict[str, Any]:
    """The static policies and templates of Cedar's JSON form by id, in file order (``policy0``, ...)."""
    policies = {**document.get("staticPolicies", {}), **document.get("templates", {})}
    return {policy_id: policies[policy_id] for policy_id in sorted(policies, key=lambda name: int(name[6:]))}


def _scopes(document: Mapping[str, Any]) -> dict[str, frozenset[str] | None]:
    """Each policy's id to the actions its scope names (``None``: any action), in file order."""
    scopes: dict[str, frozenset[str] | None] = {}
    for policy_id, policy in _policies(document).items():
        scope = policy.get("action", {})
        entities = scope.get("entities", [scope["entity"]] if "entity" in scope else None)
        scopes[policy_id] = None if entities is None else frozenset(entity["id"] for entity in entities)
    return scopes


def _resource_reads(document: Mapping[str, Any], policy_ids: Iterable[str]) -> set[str]:
    """The attributes these policies read as ``resource.<name>``."""
    policies = _policies(document)
    found: set[str] = set()

    def walk(value: object) -> None:
        if isinstance(value, dict):
            inner = value.get(".")
            if isinstance(inner, dict) and inner.get("left") == {"Var": "resource"}:
                found.add(str(inner.get("attr")))
            for child in value.values():
                walk(child)
        elif isinstance(value, list):
            for child in value:
                walk(child)

    for policy_id in policy_ids:
        walk(policies[policy_id].get("conditions", []))
    return found


_OPTIONAL_ACCESS = "unable to guarantee safety of access to optional attribute"


def _suggestion(message: str, resource: Iterable[str]) -> str:
    """``; did you mean `roles`?`` for an attribute Cedar did not find that is close to one that exists."""
    match = _NOT_FOUND.search(message)
    if match is None:
        return ""
    known: dict[str | None, Iterable[str]] = {
        PRINCIPAL_TYPE: USER_ATTRIBUTES,
        ANONYMOUS_TYPE: ANONYMOUS_ATTRIBUTES,
        RESOURCE_TYPE: resource,
        None: CONTEXT_ATTRIBUTES,
    }
    close = difflib.get_close_matches(match.group(1), list(known.get(match.group(2), ())), n=1)
    return f"; did you mean `{close[0]}`?" if close else ""


def _tidy(messages: Iterable[str]) -> list[str]:
    """One policy's errors in a stable order, without echoes of another error: the ``Anonymous`` twin of an
    attribute ``User`` lacks too (one typo), "no applicable action" beside "unrecognized action". An
    attribute only ``User`` has gets the reason ``Anonymous`` lacks it."""
    kept = sorted(set(messages), key=lambda message: (f"`{ANONYMOUS_TYPE}`" in message, message))
    matches = [_NOT_FOUND.search(message) for message in kept]
    user_lacks = {match.group(1) for match in matches if match is not None and match.group(2) == PRINCIPAL_TYPE}
    unrecognized = any(message.startswith(_UNRECOGNIZED_ACTION) for message in kept)
    tidy: list[str] = []
    for message, match in zip(kept, matches, strict=True):
        if match is not None and match.group(2) == ANONYMOUS_TYPE:
            attribute = match.group(1)
            if attribute in user_lacks:
                continue
            if attribute in USER_ATTRIBUTES:
                message += f" (a caller without a token has no {attribute}: test `principal has {attribute}` first)"
        if unrecognized and message.startswith(_NO_APPLICABLE_ACTION):
            continue
        tidy.append(message)
    return tidy
