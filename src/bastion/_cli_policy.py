"""The ``bastion policy`` commands: ``check``, ``eval``, ``schema``, ``test`` (cases with expected decisions) and
``matrix`` (who can call what)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from bastion.config import load_settings
from bastion.config._env import apply_dotenv
from bastion.errors import ConfigError

if TYPE_CHECKING:
    from bastion.policy._engine import LoadedPolicies
    from bastion.policy._schema import PolicySchema

EXIT_OK, EXIT_DENIED, EXIT_CONFIG = 0, 1, 2
EXIT_MISMATCH = 1
"""``bastion policy test``: a case whose decision (or deciding ``@id``) is not the expected one."""


def _json_object(text: str) -> dict[str, object]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def _service_schema(args: argparse.Namespace) -> PolicySchema:
    """Import ``args.app`` and return its policy schema, built with ``args.config`` (embedded defaults without);
    a bad app is a ConfigError, as for ``bastion run``."""
    from bastion._runner import import_service
    from bastion.testing._policy_cases import service_policy_schema

    service = import_service(args.app, app_dir=args.app_dir)
    return service_policy_schema(service, load_settings(args.config))


def _policy_check(args: argparse.Namespace) -> int:
    """Parse FILE; with ``--app``, validate it against that service's schema too (every problem on its own
    ``error:`` line, exit 2)."""
    from bastion._telemetry import configure_logging
    from bastion.policy._engine import PolicyValidationError, load_policies
    from bastion.policy._validation import validate

    if args.config and not args.app:
        raise ConfigError("policy check --config names the configuration of --app MODULE:ATTR: give both")
    loaded = load_policies(args.file)
    context = "any" if loaded.context_attributes is None else ", ".join(sorted(loaded.context_attributes)) or "none"
    validated = ""
    if args.app:
        configure_logging("warning", "console")  # the app's build logs go to stderr
        apply_dotenv()
        schema = _service_schema(args)
        errors, warnings = validate(schema, loaded)
        for warning in warnings:
            print(f"warning: {loaded.origin}: {warning}", file=sys.stderr)
        if errors:
            for line in PolicyValidationError(loaded.origin, tuple(errors)).lines:
                print(f"error: {line}", file=sys.stderr)
            return EXIT_CONFIG
        validated = f"; valid against the schema of {args.app}, {len(schema.actions)} actions"
    print(
        f"{args.file}: {loaded.statements} policies OK "
        f"(digest {loaded.digest}; context attributes read: {context}{validated})"
    )
    return EXIT_OK


def _policy_schema(args: argparse.Namespace) -> int:
    """Print the Cedar schema (JSON) of MODULE:ATTR's actions, principals, resources and context."""
    from bastion._telemetry import configure_logging

    configure_logging("warning", "console")  # stdout stays the JSON document
    apply_dotenv()
    schema = _service_schema(args)
    print(json.dumps(schema.document(), indent=2))
    return EXIT_OK


def _policy_eval(args: argparse.Namespace) -> int:
    from bastion.policy._capability import PRINCIPAL_TYPE, RESOURCE_TYPE, action_context
    from bastion.policy._engine import evaluate, load_policies

    loaded = load_policies(args.file)
    principal = dict(args.principal)
    principal.setdefault("roles", [])
    principal.setdefault("perms", [])
    principal_id = str(principal.get("sub") or principal.get("client_id") or "anonymous")
    decision = evaluate(
        loaded,
        principal=(PRINCIPAL_TYPE, principal_id, principal),
        action=args.action,
        resource=(RESOURCE_TYPE, args.resource_id, args.resource),
        context={**action_context(args.action), **args.context},
    )
    verdict = "ERROR" if decision.failed else "ALLOW" if decision.allowed else "DENY"
    print(verdict)
    for reason in decision.reasons:
        print(f"  reason: {reason}")
    for error in decision.errors:
        print(f"  error: {error}")
    return EXIT_OK if decision.allowed else EXIT_DENIED


def _checked(args: argparse.Namespace) -> tuple[LoadedPolicies, PolicySchema]:
    """FILE parsed and validated against ``--app``'s schema; every problem an ``error:`` line (ConfigError)."""
    from bastion._telemetry import configure_logging
    from bastion.policy._engine import PolicyValidationError, load_policies
    from bastion.policy._validation import validate

    loaded = load_policies(args.file)
    configure_logging("warning", "console")  # the app's build logs go to stderr
    apply_dotenv()
    schema = _service_schema(args)
    errors, warnings = validate(schema, loaded)
    for warning in warnings:
        print(f"warning: {loaded.origin}: {warning}", file=sys.stderr)
    if errors:
        raise PolicyValidationError(loaded.origin, tuple(errors))
    return loaded, schema


def _policy_test(args: argparse.Namespace) -> int:
    """Run the cases of ``--cases`` against FILE, offline, after checking both against ``--app``'s schema;
    print one line per case and the coverage; exit 1 on a mismatch."""
    from bastion.policy._cases import load_cases, run_case, schema_problems
    from bastion.policy._matrix import NONE, Probe, cell

    cases = load_cases(args.cases)
    loaded, schema = _checked(args)
    problems = schema_problems(cases, schema)
    if problems:
        for problem in problems:
            print(f"error: cases file {args.cases!r}: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    results = [run_case(loaded, case) for case in cases]
    for result in results:
        print(result.line())
    failed = sum(not result.passed for result in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    deciding = {reason for result in results for reason in result.deciding}
    unused = [
        source.describe()
        for policy_id, source in loaded.sources.items()
        if policy_id not in deciding and (source.id is None or source.id not in deciding)
    ]
    print("coverage:")
    print(f"  policies that decided no case: {', '.join(unused) if unused else 'none'}")
    principals = {case.principal[1]: case.principal for case in cases}
    probes = [Probe(label=name, principal=principal) for name, principal in principals.items()]
    closed = [a.name for a in schema.actions if all(cell(loaded, probe, a) == NONE for probe in probes)]
    print(f"  actions no policy permits for any principal of the cases ({len(closed)}):")
    for name in closed:
        print(f"    {name}")
    return EXIT_MISMATCH if failed else EXIT_OK


def _policy_matrix(args: argparse.Namespace) -> int:
    """Print who can call what: every action of ``--app`` by anonymous, a user without roles and each role the
    policies name (``any``: any resource, ``own``: resources whose string attributes name the caller)."""
    from bastion.policy._matrix import matrix, render, role_probes, roles_named

    loaded, schema = _checked(args)
    probes = role_probes(roles_named(loaded))
    for line in render(schema.actions, probes, matrix(loaded, schema.actions, probes)):
        print(line)
    return EXIT_OK


def add_policy_commands(commands: Any) -> None:
    """The ``policy`` command and its subcommands, on the ``bastion`` parser's subparsers."""
    policy = commands.add_parser("policy", help="check or evaluate a Cedar policy file; print a service's schema")
    policy_commands = policy.add_subparsers(dest="policy_command", required=True)
    check_policy = policy_commands.add_parser(
        "check", help="parse FILE (and validate it against --app's schema); report the statement, line and @id"
    )
    check_policy.add_argument("file", metavar="FILE")
    check_policy.add_argument("--app", metavar="MODULE:ATTR", help="validate against this service's Cedar schema")
    check_policy.add_argument("--config", metavar="FILE", help="the service's TOML configuration (with --app)")
    check_policy.add_argument(
        "--app-dir", default=".", help="directory added to sys.path before importing (default: .)"
    )
    check_policy.set_defaults(handler=_policy_check)
    schema = policy_commands.add_parser("schema", help="print the Cedar schema (JSON) of MODULE:ATTR")
    schema.add_argument("app", metavar="MODULE:ATTR", help="e.g. examples.documents_api:service")
    schema.add_argument("--config", metavar="FILE", help="the service's TOML configuration")
    schema.add_argument("--app-dir", default=".", help="directory added to sys.path before importing (default: .)")
    schema.set_defaults(handler=_policy_schema)
    evaluate = policy_commands.add_parser("eval", help="decide one request against FILE and print the reasons")
    evaluate.add_argument("file", metavar="FILE")
    evaluate.add_argument(
        "--principal",
        type=_json_object,
        default={},
        help='principal attributes, e.g. \'{"sub":"alice","roles":["user"]}\'',
    )
    evaluate.add_argument("--action", required=True, help='e.g. "GET /api/v1/documents/{user_id}/{doc_id}"')
    evaluate.add_argument(
        "--resource", type=_json_object, default={}, help='resource attributes, e.g. \'{"owner_id":"alice"}\''
    )
    evaluate.add_argument("--resource-id", default="resource", help="resource entity id (default: resource)")
    evaluate.add_argument(
        "--context",
        type=_json_object,
        default={},
        help='context, e.g. \'{"ip_address":"10.0.0.1"}\' (method, path and version come from --action)',
    )
    evaluate.set_defaults(handler=_policy_eval)

    cases = policy_commands.add_parser(
        "test", help="run CASES (TOML) against FILE offline, checked against --app's schema; exit 1 on a mismatch"
    )
    cases.add_argument("file", metavar="FILE")
    cases.add_argument("--app", required=True, metavar="MODULE:ATTR", help="the service whose schema the cases use")
    cases.add_argument("--cases", required=True, metavar="CASES.toml", help="[[case]] tables (docs/policy.md)")
    cases.add_argument("--config", metavar="FILE", help="the service's TOML configuration")
    cases.add_argument("--app-dir", default=".", help="directory added to sys.path before importing (default: .)")
    cases.set_defaults(handler=_policy_test)
    grid = policy_commands.add_parser(
        "matrix", help="print who can call what: --app's actions by anonymous, user and each role FILE names"
    )
    grid.add_argument("file", metavar="FILE")
    grid.add_argument("--app", required=True, metavar="MODULE:ATTR", help="the service whose actions to list")
    grid.add_argument("--config", metavar="FILE", help="the service's TOML configuration")
    grid.add_argument("--app-dir", default=".", help="directory added to sys.path before importing (default: .)")
    grid.set_defaults(handler=_policy_matrix)
