"""A minimal Cedar evaluation wrapper shared by the deployables: parse a policy file once, decide fail-closed.

The one module of the core that imports cedarpy (the import contracts in pyproject.toml allow this module and no
other). Bastion's engine (`bastion.policy._engine`) decides through `authorize` too and keeps its reloading,
validation and statement naming; MailRelay
imports this module only where its sender policy is built, and only with the `mailrelay[policy]` extra installed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cedarpy

from bastion_core._errors import ConfigError

MAX_POLICY_FILE_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class CedarPolicies:
    """A parsed policy set and where it came from (`origin` starts error messages)."""

    policy_set: Any  # cedarpy.PolicySet: untyped
    origin: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CedarDecision:
    """One outcome: `allowed` only when Cedar allowed it with no evaluation error; `reasons` the deciding policies
    (their `@id` where they have one), `errors` Cedar's evaluation errors."""

    allowed: bool
    reasons: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()


def load_cedar_policies(path: Path, *, origin: str) -> CedarPolicies:
    """Read and parse a Cedar policy file; ConfigError (one line, starting with `origin`) when it cannot be read,
    is over MAX_POLICY_FILE_BYTES, does not parse or holds no policy (everything would be denied)."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_POLICY_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{origin}: cannot read the file ({exc.strerror or exc})") from None
    if len(data) > MAX_POLICY_FILE_BYTES:
        raise ConfigError(f"{origin}: over {MAX_POLICY_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
        policy_set = cedarpy.PolicySet.from_str(text)
    except (UnicodeDecodeError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{origin}: does not parse as Cedar ({first_line})") from None
    if not len(policy_set):
        raise ConfigError(f"{origin}: has no policies; everything would be denied")
    return CedarPolicies(policy_set=policy_set, origin=origin)


def cedar_decide(
    policies: CedarPolicies,
    *,
    principal: tuple[str, str, Mapping[str, Any]],
    action: str,
    resource: tuple[str, str, Mapping[str, Any]],
    context: Mapping[str, Any],
    entities: Sequence[Mapping[str, Any]] = (),
) -> CedarDecision:
    """Decide one request; `principal` and `resource` are `(type, id, attributes)`, attributes and context in
    Cedar's JSON form (`{"__extn": {"fn": "ip", "arg": "192.0.2.1"}}` for an IP). Never raises (see `authorize`)."""
    allowed, reasons, errors = authorize(
        policies.policy_set, principal=principal, action=action, resource=resource, context=context, entities=entities
    )
    return CedarDecision(allowed=allowed, reasons=reasons, errors=errors)


def authorize(
    policy_set: Any,
    *,
    principal: tuple[str, str, Mapping[str, Any]],
    action: str,
    resource: tuple[str, str, Mapping[str, Any]],
    context: Mapping[str, Any],
    entities: Sequence[Mapping[str, Any]] = (),
    describe: Callable[[str], str] = str,
) -> tuple[bool, tuple[str, ...], tuple[str, ...]]:
    """Cedar's decision for one request as `(allowed, reasons, errors)`, shared by MailRelay's `cedar_decide` and
    Bastion's engine. `reasons`: the deciding policies (their `@id` where they have one); `errors`: Cedar's
    evaluation errors, each through `describe`. Never raises: an error of Cedar, or in its diagnostics, is a
    failure (cedarpy skips an erroring `forbid`, which would otherwise allow)."""
    principal_uid = {"type": principal[0], "id": principal[1]}
    resource_uid = {"type": resource[0], "id": resource[1]}
    request = {
        "principal": principal_uid,
        "action": {"type": "Action", "id": action},
        "resource": resource_uid,
        "context": dict(context),
    }
    all_entities = [
        {"uid": principal_uid, "attrs": dict(principal[2]), "parents": []},
        {"uid": resource_uid, "attrs": dict(resource[2]), "parents": []},
        *(dict(entity) for entity in entities),
    ]
    try:
        result = cedarpy.is_authorized(request, policy_set, all_entities)
    except (ValueError, TypeError, RuntimeError) as exc:
        return False, (), (f"{type(exc).__name__}: {exc}",)
    diagnostics = result.diagnostics
    by_reason = diagnostics.id_annotations_by_reason or {}
    reasons = tuple(by_reason.get(reason, reason) for reason in diagnostics.reasons)
    errors = tuple(describe(str(error)) for error in diagnostics.errors)
    return bool(result.allowed) and not errors, reasons, errors
