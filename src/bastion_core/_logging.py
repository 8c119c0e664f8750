"""One logging set-up for both programs: structlog key-value events, JSON in production, console in development."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Any

import structlog

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
UNKNOWN_VARIABLE_EVENT = "unknown_environment_variable"
"""The warning both programs log for an environment variable with their prefix that names no setting."""


def configure_logging(level: str = "info", fmt: str = "auto", *, quiet: Iterable[str] = ()) -> None:
    """Route structlog and stdlib logging through one renderer on stderr.

    ``fmt`` is ``json`` (production), ``console`` (development) or ``auto``: console when stderr is a
    terminal, JSON otherwise. Context variables bound per request or session (request id, sub, route)
    appear on every line logged meanwhile. Loggers named in ``quiet`` (chatty libraries) log from WARNING
    up only.
    """
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    number = LEVELS.get(level.lower(), logging.INFO)
    root.setLevel(number)
    for name in quiet:
        logging.getLogger(name).setLevel(max(number, logging.WARNING))
