"""The ``bastion`` command: ``run`` a service, ``check-config`` a file."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from bastion.config import load_settings, masked
from bastion.errors import ConfigError

EXIT_OK, EXIT_CONFIG = 0, 2


def _run(args: argparse.Namespace) -> int:
    from bastion.server import serve
    from bastion.telemetry import configure_logging

    settings = load_settings(args.config)
    configure_logging(settings.service.log_level, settings.service.log_format)
    return serve(
        args.app,
        settings,
        config_path=args.config,
        host=args.host,
        port=args.port,
        workers=args.workers,
        app_dir=args.app_dir,
    )


def _check_config(args: argparse.Namespace) -> int:
    settings = load_settings(args.file)
    print(f"configuration OK: {args.file}", file=sys.stderr)
    print(json.dumps(masked(settings), indent=2))
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bastion", description="Secure, versioned backend services.")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="serve MODULE:ATTR (a bastion.Service)")
    run.add_argument("app", metavar="MODULE:ATTR", help="e.g. examples.documents_api:service")
    run.add_argument("--config", metavar="FILE", help="TOML configuration (embedded defaults when omitted)")
    run.add_argument("--host", help="bind address (default: service.host, 0.0.0.0)")
    run.add_argument("--port", type=int, help="bind port (default: service.port, 8080)")
    run.add_argument("--workers", type=int, help="worker processes (default: service.workers, 1)")
    run.add_argument("--app-dir", default=".", help="directory added to sys.path before importing (default: .)")
    run.set_defaults(handler=_run)

    check = commands.add_parser("check-config", help="validate FILE and print the effective settings, secrets masked")
    check.add_argument("file", metavar="FILE")
    check.set_defaults(handler=_check_config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``bastion`` console script; returns the exit code."""
    args = _parser().parse_args(argv)
    if getattr(args, "port", None) is not None and not 0 <= args.port <= 65535:
        print(f"error: --port {args.port} is not a TCP port (0-65535)", file=sys.stderr)
        return EXIT_CONFIG
    if getattr(args, "workers", None) is not None and args.workers < 1:
        print(f"error: --workers {args.workers} must be at least 1", file=sys.stderr)
        return EXIT_CONFIG
    try:
        result: int = args.handler(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
