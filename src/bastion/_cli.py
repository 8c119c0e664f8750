"""The ``bastion`` command: ``run`` a service, ``check-config`` a file."""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import os
import sys
import traceback
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from bastion import _dev_ca as dev_ca
from bastion import _extras as extras
from bastion._cli_deprecations import add_deprecation_commands
from bastion._cli_policy import add_policy_commands
from bastion.config import Settings, load_settings, masked
from bastion.config._env import apply_dotenv
from bastion.errors import ConfigError
from bastion_core._manual import output_closed

EXIT_OK, EXIT_CONFIG = 0, 2


def _run(args: argparse.Namespace) -> int:
    from bastion._runner import serve
    from bastion._telemetry import configure_logging

    apply_dotenv()
    if args.log_level:
        # Above the environment, the file and the defaults; the workers of --workers N read it too.
        os.environ["SERVICE_LOG_LEVEL"] = args.log_level
    configure_logging()  # warnings while the settings load go to stderr too
    settings = load_settings(args.config)
    extras.check(settings)  # a configured feature without its extra: one line, before the app is imported
    configure_logging(settings.service.log_level, settings.service.log_format)
    if args.check_only:  # --reload's check of a new version: import and build, serve nothing
        from bastion._runner import build

        build(args.app, settings, app_dir=args.app_dir)
        return EXIT_OK
    if args.reload:
        return _reload(args, settings)
    return serve(
        args.app,
        settings,
        config_path=args.config,
        host=args.host,
        port=args.port,
        workers=args.workers,
        app_dir=args.app_dir,
        fd=args.fd,
    )


def _reload(args: argparse.Namespace, settings: Settings) -> int:
    from bastion import _reload
    from bastion._runner import listen

    if args.workers is not None and args.workers > 1:
        raise ConfigError("--reload runs one worker: drop --workers (or --reload, to serve with several)")
    # service.workers of the configuration is left for production: --reload runs one worker whatever it says.
    watch = _reload.watched_files(settings, config_path=args.config, app_dir=args.app_dir)
    host = args.host if args.host is not None else settings.service.host
    port = args.port if args.port is not None else settings.service.port
    argv = _reload.worker_argv(
        args.app,
        config_path=args.config,
        app_dir=args.app_dir,
        log_level=args.log_level,
        debug=args.debug_flag,
        host=host,
        port=port,
    )
    sock = listen(host, port)  # before any check or worker: a port in use is one line, and no hook runs
    return _reload.Reloader(argv, sock, watch).run()


APP_CHECKS = "policies against the app's Cedar schema, broker handlers without a broker, the app's own start-up checks"
"""What ``check-config`` checks only with ``--app`` (it imports and builds the app, as ``bastion run`` does)."""


def _check_config(args: argparse.Namespace) -> int:
    """What ``bastion run`` checks before it serves: without ``--app`` what needs no app (keys, certificates,
    policies parse, rules, extras), with ``--app`` the app imported and built too (the same ``build`` as ``run``).
    Then the report (stderr, for people: one section each) and the effective settings (stdout, JSON for tools)."""
    from bastion._security import Security
    from bastion._telemetry import configure_logging

    configure_logging("warning", "console")  # stdout stays the JSON document
    apply_dotenv()
    settings = load_settings(args.file)
    extras.check(settings)
    app_settings = None
    if args.app:
        from bastion._runner import build

        app = build(args.app, settings, app_dir=args.app_dir)
        app_settings = app.app_settings
        try:
            posture = app.posture()
        finally:
            asyncio.run(app.aclose())
        verdict = f"configuration OK with {args.app}: {args.file}"
    else:
        security = Security.from_settings(settings, realm=settings.service.name or "api")
        try:
            posture = security.posture()
        finally:
            asyncio.run(security.aclose())
        verdict = f"configuration OK: {args.file} (not checked without --app MODULE:ATTR: {APP_CHECKS})"
    print(verdict, file=sys.stderr)
    for title, lines in [("security posture", posture.lines())]:
        print(f"{title}:", file=sys.stderr)
        for line in lines:
            print(f"  {line}", file=sys.stderr)
    print(json.dumps(masked(settings, app=app_settings), indent=2))
    if not args.app:
        _app_settings_note(settings)
    return EXIT_OK


def _app_settings_note(settings: Settings) -> None:
    """Without the app, ``[app]`` and ``SERVICE_APP_*`` cannot be validated: say so (with the app, its validated
    settings are in the JSON document, masked)."""
    if settings.app.table or settings.app.environ:
        print("[app]: not checked: the app's settings model validates it (Service(settings=...))", file=sys.stderr)


def _docs(args: argparse.Namespace) -> int:
    from bastion_core._manual import show

    return show(args.topic, program="bastion")


def _dev_keys(args: argparse.Namespace) -> int:
    from bastion.testing import write_dev_keys

    private, public = write_dev_keys(args.dir)
    print(f"private key (keep it here, never deploy it): {private}\npublic key (token.public_key_path): {public}")
    return EXIT_OK


def _claim(text: str) -> tuple[str, object]:
    name, sep, raw = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--claim {text!r} must look like name=value")
    try:
        return name, json.loads(raw)
    except json.JSONDecodeError:
        return name, raw


def _not_a_private_key(path: str, pem: bytes, exc: Exception) -> ConfigError:
    hint = " (that is a public key: dev-token signs with the private one)" if b"PUBLIC KEY" in pem else ""
    return ConfigError(f"--key {path!r} is not an RSA or EC private key{hint} ({exc})")


def _dev_token(args: argparse.Namespace) -> int:
    from bastion.testing import TokenMinter

    try:
        pem = Path(args.key).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read --key {args.key!r}: {exc.strerror}") from None
    try:
        minter = TokenMinter.from_private_pem(pem, args.algorithm)
    except Exception as exc:  # whatever the key library raises for a certificate or garbage
        raise _not_a_private_key(args.key, pem, exc) from None
    claims = dict(args.claim or [])
    for name in ("username", "email", "client_id"):
        if getattr(args, name):
            claims[name] = getattr(args, name)
    if args.perms:
        claims["perms"] = args.perms
    try:
        token = minter.mint(sub=args.sub, roles=args.roles or [], ttl=args.ttl, **claims)
    except Exception as exc:  # a public key loads but cannot sign
        raise _not_a_private_key(args.key, pem, exc) from None
    print(token)
    return EXIT_OK


COMMANDS = ("run", "check-config", "policy", "deprecations", "dev-keys", "dev-ca", "dev-token", "docs")
LEVELS = ("debug", "info", "warning", "error", "critical")


def _version() -> str:
    try:
        return metadata.version("bastion")
    except metadata.PackageNotFoundError:  # pragma: no cover (a source tree without the package installed)
        return "unknown"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bastion",
        description="Secure, versioned backend services.",
        epilog="The documentation is installed with Bastion: `bastion docs` lists it, `bastion docs TOPIC` prints one.",
    )
    parser.add_argument("--version", action="version", version=f"bastion {_version()}")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of a start-up error (also: BASTION_DEBUG=1)"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="serve MODULE:ATTR (a bastion.Service)")
    run.add_argument("app", metavar="MODULE:ATTR", help="e.g. examples.documents_api:service")
    run.add_argument("--config", metavar="FILE", help="TOML configuration (embedded defaults when omitted)")
    run.add_argument("--host", help="bind address (default: service.host, 0.0.0.0)")
    run.add_argument("--port", type=int, help="bind port (default: service.port, 8080)")
    run.add_argument("--workers", type=int, help="worker processes (default: service.workers, 1)")
    run.add_argument("--app-dir", default=".", help="directory added to sys.path before importing (default: .)")
    run.add_argument("--log-level", choices=LEVELS, type=str.lower, help="log level (default: service.log_level, info)")
    run.add_argument(
        "--reload",
        action="store_true",
        help="development: restart when *.py under --app-dir, the config, .env or the policy file change",
    )
    run.add_argument("--fd", type=int, help=argparse.SUPPRESS)  # --reload's worker: serve on this inherited socket
    run.add_argument("--check-only", action="store_true", help=argparse.SUPPRESS)  # --reload's check of a new version
    run.set_defaults(handler=_run)

    check = commands.add_parser(
        "check-config",
        help="run the checks of `bastion run` on FILE (and, with --app, on the app) and print the effective "
        "settings, secrets masked",
    )
    check.add_argument("file", metavar="FILE")
    check.add_argument("--app", metavar="MODULE:ATTR", help=f"import and build this service too, to check {APP_CHECKS}")
    check.add_argument("--app-dir", default=".", help="directory added to sys.path before importing (default: .)")
    check.set_defaults(handler=_check_config)

    add_policy_commands(commands)
    add_deprecation_commands(commands)

    keys = commands.add_parser("dev-keys", help="development only: create an RS256 key pair (kept if present)")
    keys.add_argument("--dir", default=".dev", help="where to write jwt-private.pem and jwt-public.pem (.dev)")
    keys.set_defaults(handler=_dev_keys)
    dev_ca.add_parser(commands)

    token = commands.add_parser("dev-token", help="development only: print a signed JWT for trying a service")
    token.add_argument("--key", required=True, metavar="FILE", help="private key PEM (e.g. .dev/jwt-private.pem)")
    token.add_argument("--algorithm", choices=["RS256", "RS384", "RS512", "ES256", "ES384"])
    token.add_argument("--sub", default="alice")
    token.add_argument("--roles", nargs="*", metavar="ROLE")
    token.add_argument("--perms", nargs="*", metavar="PERM")
    token.add_argument("--username")
    token.add_argument("--email")
    token.add_argument("--client-id", dest="client_id")
    token.add_argument("--ttl", type=int, default=3600, help="lifetime in seconds (3600)")
    token.add_argument("--claim", action="append", type=_claim, metavar="NAME=VALUE", help="extra claim (JSON value)")
    token.set_defaults(handler=_dev_token)

    docs = commands.add_parser("docs", help="list the installed documentation, or print one TOPIC (Markdown)")
    docs.add_argument("topic", nargs="?", metavar="TOPIC", help="e.g. installation, configuration, auth")
    docs.set_defaults(handler=_docs)
    return parser


def _unknown_command(argv: Sequence[str]) -> str | None:
    """The one-line error for a misspelled command (argparse lists the choices but suggests none)."""
    words = [word for word in argv if not word.startswith("-")]
    if not words or words[0] in COMMANDS:
        return None
    close = difflib.get_close_matches(words[0], COMMANDS, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f" (commands: {', '.join(COMMANDS)})"
    return f"error: unknown command {words[0]!r}{hint}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``bastion`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    unknown = _unknown_command(argv)
    if unknown is not None:
        print(unknown, file=sys.stderr)
        return EXIT_CONFIG
    args = _parser().parse_args(argv)
    debug = args.debug or os.environ.get("BASTION_DEBUG", "") not in ("", "0", "false")
    args.debug_flag = args.debug  # what a --reload worker is started with (BASTION_DEBUG is inherited)
    if getattr(args, "port", None) is not None and not 0 <= args.port <= 65535:
        print(f"error: --port {args.port} is not a TCP port (0-65535)", file=sys.stderr)
        return EXIT_CONFIG
    if getattr(args, "workers", None) is not None and args.workers < 1:
        print(f"error: --workers {args.workers} must be at least 1", file=sys.stderr)
        return EXIT_CONFIG
    try:
        result: int = args.handler(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
    except BrokenPipeError:
        return output_closed()
    except ConfigError as exc:
        if debug:
            traceback.print_exception(exc)
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
