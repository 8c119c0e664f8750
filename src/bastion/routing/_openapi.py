"""A version's OpenAPI document completed with what the pipeline adds in front of its handlers.

FastAPI documents what a handler returns. Bastion's layers answer too: 401 from token auth, 403 from the policy,
429 from the rate limiter, 413 and 400 from the body checks, 503 from a resilience layer, 504 from the timeout,
and 422 in Bastion's error shape rather than FastAPI's. :func:`complete_openapi` adds those answers to each
operation that can get them, the bearer scheme, and the characters a path parameter may hold (a value the
canonical path would split or rewrite reaches another route). Pure: no I/O, no FastAPI import.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.convertors import StringConvertor

from bastion.routing._resolve import RouteEntry

BEARER_SCHEME = "bearerAuth"
PERMITTED_ROLES = "x-permitted-roles"
"""Each operation's note of who the policies let call it: ``anonymous``, ``user`` (any token) and each role
they name, as ``"any"`` (any resource) or ``"own"`` (resources whose parameters name the caller)."""
ERROR_SCHEMA = "Error"
RATE_LIMIT_ERROR_SCHEMA = "RateLimitError"
SEGMENT_PATTERN = r"^(?!\.\.?$)[^/\x00-\x1f\x7f]+$"
"""One path segment as the canonical path keeps it: no ``/`` (a decoded ``%2F`` splits the segment), not ``.`` or
``..`` (resolved away), no control characters (400). See ``bastion.routing._paths``."""

_FASTAPI_422_SCHEMA = {"$ref": "#/components/schemas/HTTPValidationError"}
_FASTAPI_422_COMPONENTS = ("HTTPValidationError", "ValidationError")
_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})
_INTEGER = {"type": "integer"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Gates:
    """What stands in front of one version's operations, as far as their answers go.

    ``needs_token(template)``: token auth applies to the path template (``None``: token auth is off).
    ``guarded(template)``: a resilience layer guards it. Templates are judged as written, so an exact
    ``exclude_paths`` entry for one concrete path of a templated route does not make the operation public.
    """

    needs_token: Callable[[str], bool] | None
    bearer_format: str = "JWT"
    policy: bool
    rate_limited: bool
    guarded: Callable[[str], bool]
    max_body_bytes: int
    timeout_secs: float
    permitted_roles: Callable[[str], Mapping[str, str]] | None = None
    """``"<METHOD> <template>"`` -> ``{role: "any" | "own"}`` the policies permit (``x-permitted-roles``)."""
    policy_digest: str = ""
    """The digest of the policies ``permitted_roles`` reads: a reload changes it and the documents are redone."""


def segment_parameters(entries: Iterable[RouteEntry]) -> dict[str, frozenset[str]]:
    """``{path template: names of its plain-segment parameters}``: ``{name}`` or ``{name:str}``, not ``:path``
    (which may hold ``/``) or the typed convertors (whose schema already says what they take)."""
    found: dict[str, frozenset[str]] = {}
    for entry in entries:
        plain = frozenset(name for name, convertor in entry.convertors.items() if type(convertor) is StringConvertor)
        found[entry.template] = found.get(entry.template, frozenset()) | plain
    return found


def complete_openapi(
    document: Mapping[str, Any], *, gates: Gates, segment_params: Mapping[str, frozenset[str]]
) -> dict[str, Any]:
    """A copy of ``document`` with the pipeline's answers, the bearer scheme and path-parameter patterns.

    An answer the handler already documents for a status is kept, except FastAPI's own 422 (its
    ``HTTPValidationError`` body is not what Bastion sends).
    """
    completed: dict[str, Any] = copy.deepcopy(dict(document))
    components = completed.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    error_name = _free_name(schemas, ERROR_SCHEMA, _error_schema())
    limit_name = _free_name(schemas, RATE_LIMIT_ERROR_SCHEMA, _rate_limit_schema())
    schemas[error_name] = _error_schema()
    schemas[limit_name] = _rate_limit_schema()
    responses = _Responses(
        gates=gates, error=f"#/components/schemas/{error_name}", rate_limit_error=f"#/components/schemas/{limit_name}"
    )
    any_token = False
    for template, item in completed.get("paths", {}).items():
        plain = segment_params.get(template, frozenset())
        for method, operation in item.items():
            if method not in _METHODS or not isinstance(operation, dict):
                continue
            _pattern_path_parameters(operation, plain)
            any_token |= responses.add(template, operation)
            if gates.permitted_roles is not None:
                operation[PERMITTED_ROLES] = dict(gates.permitted_roles(f"{method.upper()} {template}"))
    if any_token:
        components.setdefault("securitySchemes", {})[BEARER_SCHEME] = {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": gates.bearer_format,
            "description": "Authorization: Bearer <token>, as the token service issued it.",
        }
    _drop_unused_fastapi_422(completed)
    return completed


def _free_name(schemas: Mapping[str, Any], name: str, schema: Mapping[str, Any]) -> str:
    """``name``, or ``Bastion<name>`` when the service's own models already use it for something else."""
    return name if schemas.get(name, schema) == schema else f"Bastion{name}"


def _error_schema() -> dict[str, Any]:
    return {
        "title": "Error",
        "description": "Bastion's error body: every error the pipeline or a handler raises has this shape.",
        "type": "object",
        "required": ["error", "code", "status"],
        "properties": {
            "error": {"type": "string", "description": "Human-readable message."},
            "code": {"type": "string", "description": "Machine code, e.g. FORBIDDEN."},
            "status": {"type": "integer", "description": "The HTTP status."},
        },
    }


def _rate_limit_schema() -> dict[str, Any]:
    schema = _error_schema()
    schema["title"] = "RateLimitError"
    schema["description"] = "The error body of a 429: the error shape with the seconds to wait."
    schema["required"] = [*schema["required"], "retry_after"]
    schema["properties"]["retry_after"] = {"type": "integer", "minimum": 0, "description": "Seconds to wait."}
    return schema


def _pattern_path_parameters(operation: dict[str, Any], plain: frozenset[str]) -> None:
    for parameter in operation.get("parameters", ()):
        if parameter.get("in") != "path" or parameter.get("name") not in plain:
            continue
        schema = parameter.setdefault("schema", {})
        if schema.get("type", "string") == "string" and "pattern" not in schema:
            schema["pattern"] = SEGMENT_PATTERN


@dataclass(frozen=True, slots=True, kw_only=True)
class _Responses:
    """Adds the pipeline's answers to one operation at a time."""

    gates: Gates
    error: str
    rate_limit_error: str

    def add(self, template: str, operation: dict[str, Any]) -> bool:
        """Add the answers ``operation`` can get; whether it needs a token."""
        gates = self.gates
        responses: dict[str, Any] = operation.setdefault("responses", {})
        has_body = "requestBody" in operation
        has_path_params = any(parameter.get("in") == "path" for parameter in operation.get("parameters", ()))
        needs_token = gates.needs_token is not None and gates.needs_token(template)
        bad_request = []
        if has_path_params:
            bad_request.append("a path parameter holds a control character (BAD_REQUEST)")
        if has_body:
            bad_request.append("the body is not valid JSON (MALFORMED_BODY) or nests it too deeply (JSON_TOO_DEEP)")
        if bad_request:
            self._put(responses, 400, f"Bad request: {'; '.join(bad_request)}.")
        if has_body:
            self._put(responses, 413, f"Request body over {gates.max_body_bytes} bytes (middleware.max_body_bytes).")
        if needs_token:
            operation["security"] = [{BEARER_SCHEME: []}]
            self._put(
                responses,
                401,
                "No valid bearer token: UNAUTHORIZED (missing or malformed), INVALID_TOKEN, TOKEN_EXPIRED, "
                "TOKEN_REVOKED.",
                headers={
                    "WWW-Authenticate": {
                        "description": 'The RFC 6750 challenge: Bearer, with error="invalid_token" for a bad token.',
                        "required": True,
                        "schema": {"type": "string"},
                    }
                },
            )
        if gates.policy:
            self._put(responses, 403, "The policy denies the request (FORBIDDEN).")
        if has_path_params:
            self._put(responses, 404, "Nothing at this path (NOT_FOUND).")
        if responses.get("422", {}).get("content", {}).get("application/json", {}).get("schema") == (
            _FASTAPI_422_SCHEMA
        ):
            del responses["422"]
            self._put(responses, 422, "The parameters or the body do not match (VALIDATION_ERROR).")
        if gates.rate_limited:
            self._put(
                responses,
                429,
                "Rate limit exceeded (RATE_LIMIT_EXCEEDED).",
                schema=self.rate_limit_error,
                headers={
                    "Retry-After": _header("Seconds until the bucket has room again."),
                    "X-RateLimit-Limit": _header("Requests allowed in the window."),
                    "X-RateLimit-Remaining": _header("Requests left in the window: 0."),
                    "X-RateLimit-Reset": _header("When the window resets (Unix seconds)."),
                },
            )
        if gates.guarded(template):
            self._put(
                responses,
                503,
                "A resilience layer refuses the request: circuit open or bulkhead full (SERVICE_UNAVAILABLE).",
                headers={"Retry-After": _header("Seconds to wait before trying again.")},
            )
        self._put(responses, 504, f"No answer within {gates.timeout_secs:g}s (GATEWAY_TIMEOUT).")
        operation["responses"] = dict(sorted(responses.items()))
        return needs_token

    def _put(
        self,
        responses: dict[str, Any],
        status: int,
        description: str,
        *,
        schema: str | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> None:
        if str(status) in responses:
            return  # the handler documents this status itself
        response: dict[str, Any] = {
            "description": description,
            "content": {"application/json": {"schema": {"$ref": schema or self.error}}},
        }
        if headers:
            response["headers"] = dict(headers)
        responses[str(status)] = response


def _header(description: str) -> dict[str, Any]:
    return {"description": description, "required": True, "schema": dict(_INTEGER)}


def _drop_unused_fastapi_422(document: dict[str, Any]) -> None:
    """Remove FastAPI's validation-error models once no operation refers to them."""
    schemas = document.get("components", {}).get("schemas", {})
    for name in _FASTAPI_422_COMPONENTS:
        if name not in schemas:
            continue
        remaining = {key: value for key, value in schemas.items() if key != name}
        rest = {**document, "components": {**document["components"], "schemas": remaining}}
        if f'"#/components/schemas/{name}"' not in json.dumps(rest):
            del schemas[name]
