"""Policy test cases in a user's test suite: the cases ``bastion policy test`` runs, as one assertion."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from bastion.config import Settings, load_settings
from bastion.policy._cases import CaseResult, load_cases, run_case, schema_problems
from bastion.policy._engine import PolicyValidationError, load_policies
from bastion.policy._schema import PolicySchema
from bastion.policy._validation import validate

if TYPE_CHECKING:
    from bastion._service import Service


def service_policy_schema(service: Service, settings: Settings | None = None) -> PolicySchema:
    """The Cedar schema of ``service`` built with ``settings`` (embedded defaults without), token authentication
    and policy off: their keys and policy file play no part in the schema. Call it outside an event loop."""
    settings = settings if settings is not None else load_settings(None)
    settings = settings.model_copy(
        update={
            "token": settings.token.model_copy(update={"enabled": False}),
            "policy": settings.policy.model_copy(update={"enabled": False}),
        }
    )
    app = service.build(settings)
    try:
        return app.policy_schema()
    finally:
        asyncio.run(app.aclose())


def check_policy_cases(
    policies: str | Path, cases: str | Path, *, service: Service | None = None, settings: Settings | None = None
) -> list[CaseResult]:
    """Run the ``[[case]]`` tables of ``cases`` against the policy file ``policies``, as ``bastion policy test``.

    With ``service``, the policies and the cases are first checked against its schema (an unknown action or
    resource attribute fails). Raises AssertionError listing every case whose decision or deciding ``@id`` is
    not the expected one; returns the results otherwise. A malformed file raises ConfigError naming the file,
    case and field. Call it from a synchronous test (it builds the service without serving it).
    """
    loaded = load_policies(policies)
    parsed = load_cases(cases)
    if service is not None:
        schema = service_policy_schema(service, settings)
        errors, _ = validate(schema, loaded)
        if errors:
            raise PolicyValidationError(loaded.origin, tuple(errors))
        problems = schema_problems(parsed, schema)
        if problems:
            raise AssertionError(f"cases file {str(cases)!r} does not fit the service:\n" + "\n".join(problems))
    results = [run_case(loaded, case) for case in parsed]
    failed = [result.line() for result in results if not result.passed]
    if failed:
        raise AssertionError(f"{len(failed)} of {len(results)} policy cases failed:\n" + "\n".join(failed))
    return results
