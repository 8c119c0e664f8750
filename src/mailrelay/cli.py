"""`mailrelay`: read MAIL_RELAY_* settings, start the SMTP, health and (when configured) metrics listeners, stop
gracefully on SIGTERM/SIGINT. Exit codes: 0 after a clean shutdown, 2 for a configuration error, 1 when a
listener cannot be opened."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

import structlog

from bastion_core import UNKNOWN_VARIABLE_EVENT, ConfigError, configure_logging
from bastion_core._manual import output_closed
from bastion_core._manual import show as show_docs
from mailrelay import _extras as extras
from mailrelay._assembly import USER_AGENT, dmarc_checker, sender_rules, serve
from mailrelay._config import (
    load_settings,
    mask_nats_url,
    read_environment,
    refuse_unknown_variables,
    unknown_variables,
    variable_defaults,
)
from mailrelay._config.routes import relay_routes
from mailrelay._errors import ListenFailed, QueueUnavailable
from mailrelay._tls import server_context
from mailrelay.smtp import _compat as smtp_compat

EXIT_CONFIG = 2
EXIT_LISTEN = 1
EXIT_QUEUE = 1
# Libraries whose INFO/DEBUG chatter stays out of the relay's log: aiosmtpd, the HTTP client, nats-py (which can
# name the server with its credentials) and asyncio (it names its selector at DEBUG).
QUIET_LOGGERS = ("mail.log", "aiohttp", "nats", "asyncio")

log = structlog.get_logger("mailrelay")


USAGE = (
    "usage: mailrelay [--help] [--version] [docs [TOPIC]] [dead-letters list|show|replay ...]"
    "   (configured by MAIL_RELAY_* variables and ./.env)"
)


def help_text() -> str:
    """``mailrelay --help``: how it is configured, then every variable (the required ones first) with its default
    and what it is for."""
    rows = variable_defaults()
    width = max(len(name) for name, _, _ in rows)
    default_width = max(len("default"), *(len(default) for _, default, _ in rows))
    lines = [
        USAGE,
        "",
        "SMTP server that posts each accepted message to a webhook as signed JSON. Settings come from MAIL_RELAY_*",
        "variables (the process environment wins over ./.env); a bad value or an unknown MAIL_RELAY_* name stops",
        "it with exit code 2 before it listens. More on each variable: `mailrelay docs` (the manual installed",
        "with MailRelay; `mailrelay docs installation` for the extras).",
        "`mailrelay dead-letters --help`: list, show and replay the dead letters of queue mode.",
        "",
        f"{'variable':<{width}}  {'default':<{default_width}}  meaning",
        *(f"{name:<{width}}  {default:<{default_width}}  {meaning}" for name, default, meaning in rows),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point: ``--help``, ``--version``, or no arguments to run."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args in (["--version"], ["-V"]):
            print(USER_AGENT, flush=True)
            return 0
        if args in (["--help"], ["-h"]):
            print(help_text(), flush=True)
            return 0
        if args[:1] == ["docs"] and len(args) <= 2:
            return show_docs(args[1] if len(args) == 2 else "mailrelay", program="mailrelay")
        if args[:1] == ["dead-letters"]:
            from mailrelay._dead_letter_cli import main as dead_letters

            return dead_letters(args[1:])
    except BrokenPipeError:  # `mailrelay docs | head`: the reader left
        return output_closed()
    if args:
        print(USAGE, file=sys.stderr)
        return EXIT_CONFIG
    try:
        settings = load_settings()
        unknown = unknown_variables(read_environment())
        if not settings.ignore_unknown_variables:
            refuse_unknown_variables(unknown)
        tls_context, reloading = server_context(settings.tls_cert, settings.tls_key)
        extras.check(settings)  # a configured feature without its extra: one line
        dmarc = dmarc_checker(settings)
        routes = relay_routes(settings)  # a never-matching pattern or two overlapping routes: one line
        sender = sender_rules(settings)
        smtp_compat.check()  # the SMTP session limits rely on aiosmtpd internals
    except ConfigError as exc:
        print(f"mailrelay: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(settings.log_level, settings.log_format, quiet=QUIET_LOGGERS)
    for name in unknown:
        log.warning(UNKNOWN_VARIABLE_EVENT, variable=name)
    if reloading is None:
        log.warning(
            "self_signed_certificate_generated",
            hint="set MAIL_RELAY_TLS_CERT and MAIL_RELAY_TLS_KEY to serve a trusted certificate",
        )
    try:
        asyncio.run(serve(settings, tls_context, dmarc, routes=routes, sender=sender, tls_reload=reloading))
    except ListenFailed as exc:
        log.error("listen_failed", variables=exc.variables, address=exc.address, error=exc.reason)
        return EXIT_LISTEN
    except QueueUnavailable as exc:
        log.error("queue_unavailable", nats=mask_nats_url(settings.nats_url or ""), error=exc.reason)
        return EXIT_QUEUE
    return 0
