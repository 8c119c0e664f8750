"""The Cedar engine: a policy file parsed once into a ``PolicySet``, evaluated fail-closed, reloadable."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cedarpy

from bastion.errors import ConfigError
from bastion_core._cedar import authorize


class PolicyLoadError(ConfigError):
    """A policy file that cannot be read or parsed (names the file, and the statement and line where known)."""


class PolicyValidationError(PolicyLoadError):
    """A policy file that parses but does not validate against the service's schema (``bastion.policy._schema``).

    ``lines`` holds one self-contained line per problem (file, statement, line, ``@id``, Cedar's message); the
    message is the first of them, so a start-up failure stays one line.
    """

    def __init__(self, origin: str, problems: tuple[str, ...]) -> None:
        self.lines = tuple(
            f"{origin} does not validate against the service's schema: {problem}" for problem in problems
        )
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(self.lines[0] + more)


@dataclass(frozen=True, slots=True, kw_only=True)
class Statement:
    """Where one policy of a file is: its number (from 1), first line and ``@id`` annotation."""

    number: int
    line: int
    id: str | None

    def describe(self) -> str:
        """``statement 2 (line 14), @id("admin-any")``: what error messages name instead of Cedar's ``policy1``."""
        where = f"statement {self.number} (line {self.line})"
        return where if self.id is None else f'{where}, @id("{self.id}")'


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
    """A parsed policy file: the set, its content hash, the context attributes its policies read, and what
    error messages and validation need (its text, name, statements and JSON form)."""

    policy_set: Any
    digest: str
    statements: int
    context_attributes: frozenset[str] | None
    """Context attributes referenced by any policy; ``None`` when a policy uses ``context`` as a whole."""
    text: str
    origin: str
    """How error messages name the file: ``policy.policy_path = 'p.cedar'`` or ``policy file 'p.cedar'``."""
    sources: Mapping[str, Statement]
    """Cedar's policy ids (``policy0``, ...) to the statements they came from."""
    document: Mapping[str, Any]
    """The policies in Cedar's JSON form (``staticPolicies``, ``templates``), for validation."""

    def describe(self, message: str) -> str:
        """``message`` (a Cedar error) with each ``policyN`` it names replaced by its statement, line and ``@id``."""
        return _POLICY_ID.sub(lambda match: self.label(match.group(1)), message)

    def label(self, policy_id: str) -> str:
        """Cedar's ``policyN`` as ``statement N+1 (line L), @id("...")`` (itself when unknown)."""
        source = self.sources.get(policy_id)
        return policy_id if source is None else source.describe()


_POLICY_ID = re.compile(r"(?:policy )?`(policy\d+)`")


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
    policies = {**document.get("staticPolicies", {}), **document.get("templates", {})}
    if not policies:
        raise PolicyLoadError(f"{origin} has no policies; everything would be denied")
    return LoadedPolicies(
        policy_set=policy_set,
        digest=hashlib.sha256(text.encode()).hexdigest()[:16],
        statements=len(policies),
        context_attributes=_context_attributes(document),
        text=text,
        origin=origin,
        sources=_sources(text, policies),
        document=document,
    )


def _sources(text: str, policies: Mapping[str, Any]) -> dict[str, Statement]:
    """Cedar's ids for the policies of ``text`` (``policyN``: the N-th statement, from 0) to their statements."""
    sources: dict[str, Statement] = {}
    for number, line, _ in split_statements(text):
        policy_id = f"policy{number - 1}"
        if policy_id in policies:
            annotation = (policies[policy_id].get("annotations") or {}).get("id")
            sources[policy_id] = Statement(number=number, line=line, id=annotation)
    return sources


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
        self.validator: Callable[[LoadedPolicies], None] | None = None
        """Checks every reloaded set before it is swapped in (the service's schema); raises PolicyLoadError."""

    def file_signature(self) -> tuple[int, int] | None:
        """``(mtime_ns, size)`` of the policy file, ``None`` when it cannot be read; taken before each load."""
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size

    def reload(self) -> LoadedPolicies:
        """Re-read, re-parse and validate the file; on success swap it in, on failure keep the old set and raise."""
        signature = self.file_signature()
        loaded = load_policies(self.path, key=self.key)
        if self.validator is not None:
            self.validator(loaded)
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
    allowed, reasons, errors = authorize(
        policies.policy_set,
        principal=principal,
        action=action,
        resource=resource,
        context=context,
        describe=policies.describe,
    )
    return Decision(allowed=allowed, reasons=reasons, errors=errors)
