"""The Cedar engine: a policy file parsed once into a ``PolicySet``, evaluated fail-closed, reloadable."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cedarpy

from bastion.errors import ConfigError


class PolicyLoadError(ConfigError):
    """A policy file that cannot be read or parsed (names the file, and the statement and line where known)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """One authorization outcome. ``errors`` non-empty means evaluation failed (never a plain Allow)."""

    allowed: bool
    reasons: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        return bool(self.errors)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadedPolicies:
    """A parsed policy file: the set, its content hash and the context attributes its policies read."""

    policy_set: Any
    digest: str
    statements: int
    context_attributes: frozenset[str] | None
    """Context attributes referenced by any policy; ``None`` when a policy uses ``context`` as a whole."""


def split_statements(text: str) -> Iterator[tuple[int, int, str]]:
    """Yield ``(number, line, text)`` for each ``;``-terminated statement, skipping strings and comments."""
    start, line, start_line, number = 0, 1, 1, 0
    in_string = escaped = in_comment = False
    seen_code = False
    for index, char in enumerate(text):
        if char == "\n":
            line += 1
            in_comment = False
            continue
        if in_comment:
            continue
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            continue
        if char == "/" and text[index + 1 : index + 2] == "/":
            in_comment = True
            continue
        if not char.isspace() and not seen_code:
            seen_code, start_line = True, line
        if char == '"':
            in_string = True
        elif char == ";":
            number += 1
            yield number, start_line, text[start : index + 1]
            start, seen_code = index + 1, False
    if seen_code:
        yield number + 1, start_line, text[start:]


def _locate_error(text: str) -> str | None:
    for number, line, statement in split_statements(text):
        try:
            cedarpy.PolicySet.from_str(statement)
        except ValueError as exc:
            return f"statement {number} (line {line}): {exc}"
    return None


def _context_attributes(node: object) -> frozenset[str] | None:
    """The attributes read as ``context.<attr>`` or ``context has <attr>`` in Cedar's JSON policy form.

    ``None`` when a policy uses ``context`` as a whole (then every attribute matters).
    """
    found: set[str] = set()
    whole = False

    def walk(value: object) -> None:
        nonlocal whole
        if isinstance(value, dict):
            for key in (".", "has"):
                inner = value.get(key)
                if isinstance(inner, dict) and inner.get("left") == {"Var": "context"} and "attr" in inner:
                    found.add(str(inner["attr"]))
                    return
            if value == {"Var": "context"}:
                whole = True
                return
            for child in value.values():
                walk(child)
        elif isinstance(value, list):
            for child in value:
                walk(child)

    walk(node)
    return None if whole else frozenset(found)


def load_policies(path: str | Path, *, key: str | None = None) -> LoadedPolicies:
    """Read and parse ``path``; raise PolicyLoadError naming the file (and the config ``key`` that named it, if
    any) and, where Cedar does not, the statement and line."""
    origin = f"{key} = {str(path)!r}" if key else f"policy file {str(path)!r}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyLoadError(f"{origin}: cannot read the file (no such file)") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise PolicyLoadError(f"{origin}: cannot read the file ({reason})") from None
    return parse_policies(text, origin=origin)


def parse_policies(text: str, *, origin: str = "policies") -> LoadedPolicies:
    """Parse Cedar policy text; ``origin`` (e.g. ``policy file 'p.cedar'``) starts every error message."""
    try:
        policy_set = cedarpy.PolicySet.from_str(text)
    except ValueError as exc:
        where = _locate_error(text)
        raise PolicyLoadError(f"{origin} does not parse: {where or exc}") from None
    document = json.loads(cedarpy.policies_to_json_str(text))
    statements = len(document.get("staticPolicies", {})) + len(document.get("templates", {}))
    if statements == 0:
        raise PolicyLoadError(f"{origin} has no policies; everything would be denied")
    return LoadedPolicies(
        policy_set=policy_set,
        digest=hashlib.sha256(text.encode()).hexdigest()[:16],
        statements=statements,
        context_attributes=_context_attributes(document),
    )


class PolicyEngine:
    """Evaluate requests against the current policy set; ``reload()`` swaps it atomically.

    Cedar's own semantics decide (forbid wins, then permit, else deny), except that any evaluation error
    in the diagnostics makes the decision a failure: cedarpy skips an erroring ``forbid``, which would
    otherwise turn an error into an Allow.
    """

    def __init__(self, path: str | Path, *, key: str | None = None) -> None:
        self.path = Path(path)
        self.key = key
        self._lock = threading.Lock()
        self.signature = self.file_signature()
        self.current = load_policies(self.path, key=key)

    def file_signature(self) -> tuple[int, int] | None:
        """``(mtime_ns, size)`` of the policy file, ``None`` when it cannot be read; taken before each load."""
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size

    def reload(self) -> LoadedPolicies:
        """Re-read and re-parse the file; on success swap it in, on failure keep the old set and raise."""
        signature = self.file_signature()
        loaded = load_policies(self.path, key=self.key)
        with self._lock:
            self.current = loaded
            self.signature = signature
        return loaded

    def evaluate(
        self,
        *,
        principal: tuple[str, str, Mapping[str, Any]],
        action: str,
        resource: tuple[str, str, Mapping[str, Any]],
        context: Mapping[str, Any],
    ) -> Decision:
        """Decide one request. ``principal`` and ``resource`` are ``(type, id, attributes)``."""
        return evaluate(self.current, principal=principal, action=action, resource=resource, context=context)


def evaluate(
    policies: LoadedPolicies,
    *,
    principal: tuple[str, str, Mapping[str, Any]],
    action: str,
    resource: tuple[str, str, Mapping[str, Any]],
    context: Mapping[str, Any],
) -> Decision:
    principal_uid = {"type": principal[0], "id": principal[1]}
    resource_uid = {"type": resource[0], "id": resource[1]}
    request = {
        "principal": principal_uid,
        "action": {"type": "Action", "id": action},
        "resource": resource_uid,
        "context": dict(context),
    }
    entities = [
        {"uid": principal_uid, "attrs": dict(principal[2]), "parents": []},
        {"uid": resource_uid, "attrs": dict(resource[2]), "parents": []},
    ]
    try:
        result = cedarpy.is_authorized(request, policies.policy_set, entities)
    except (ValueError, TypeError, RuntimeError) as exc:
        return Decision(allowed=False, errors=(f"{type(exc).__name__}: {exc}",))
    diagnostics = result.diagnostics
    by_reason = diagnostics.id_annotations_by_reason or {}
    reasons = tuple(by_reason.get(reason, reason) for reason in diagnostics.reasons)
    errors = tuple(str(error) for error in diagnostics.errors)
    return Decision(allowed=bool(result.allowed) and not errors, reasons=reasons, errors=errors)
